"""What is secret, and how every string the framework shows or records is scrubbed of it.

One rule for every place: ``config.json``, ``run.json``, the backends, ``gatle-ignite config``,
error messages and the command lines a run records.
"""

import ast
import functools
import json
import os
import re
import shlex
import sys
import traceback
from collections.abc import Sequence
from typing import Union

__all__ = [
    "REDACTED",
    "SECRET_SUFFIXES",
    "config_payload",
    "environment_secrets",
    "is_secret_name",
    "is_secret_path",
    "is_secret_query_name",
    "redact",
    "redact_argv",
    "redact_text",
    "redacted_excepthook",
    "redacted_thread_excepthook",
    "shown_command",
    "shown_value",
]

# The original rule, kept within the new one so that no field it redacted is shown now.
SECRET_SUFFIXES = ("_url", "_key", "_token", "_secret")
REDACTED = "<redacted>"

# A name holding one of these words is a credential wherever the word stands.
_SECRET_WORDS = frozenset(
    {"password", "passwd", "secret", "token", "apikey", "credential", "credentials"}
)
# These only at the end: `api_key` and `discord_url` are secrets, `key_dim` and `url_base` not.
_SECRET_LAST_WORDS = frozenset({"key", "url"})
# Upper-case runs ("API" in "APIKey") or capitalised words; `_`, `-` and digits fall between.
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
# A query parameter is read more widely than a field: a URL's names are terse (`sig`, `pwd`) or
# run words together (`sessiontoken`, `sslpassword`), and a `url` in one is an address, not a key.
_QUERY_SECRET_WORDS = _SECRET_WORDS | {"pwd", "pass", "sig", "signature", "auth", "authorization"}
_QUERY_SECRET_ENDINGS = (
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "accesskey",
    "secretkey",
    "privatekey",
    "credential",
    "signature",
)
# The userinfo of a URL: everything between "scheme://" and the last "@" before the path.
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^\s/?#]*@")
# A URL in running text, up to a space or a character no URL holds unquoted (a quote, \).
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>\\`]*")
# One `name=value` of a URL's query or fragment (an OAuth token travels in the fragment).
_QUERY_PARAM = re.compile(r"([?&#])([^=&#?]+)=([^&#]*)")
# A command-line flag, with its value when written as one word: `--api-key` or `--api-key=X`.
_FLAG = re.compile(r"(--?[A-Za-z][\w-]*)(?:=(.*))?", re.DOTALL)
# The key of a `key=value` setting (an override): a dotted field path.
_SETTING_KEY = re.compile(r"\s*[A-Za-z_][\w.-]*\s*")


def _words(name: str) -> list:
    return [word.lower() for word in _WORD.findall(name)]


def is_secret_name(name) -> bool:
    """Whether a field called ``name`` holds a credential (``password``, ``apiKey``, ``db_url``).

    Its words (split on ``_``, ``-``, digits and camelCase, compared lower-case) hold password,
    passwd, secret, token, apikey or credential(s), or its last word is ``key`` or ``url``.
    """
    return isinstance(name, str) and _secret_name(name)


@functools.lru_cache(maxsize=4096)
def _secret_name(name: str) -> bool:
    # Asked of every key of every record written: a run rewrites run.json at each checkpoint.
    if name.lower().endswith(SECRET_SUFFIXES):
        return True
    words = _words(name)
    if _token_number(words):
        return False
    return bool(words) and (words[-1] in _SECRET_LAST_WORDS or not _SECRET_WORDS.isdisjoint(words))


def _token_number(words: list) -> bool:
    """A vocabulary's token id (``pad_token_id``, ``bos_token_id``: a model config's), which
    names no credential."""
    return (
        len(words) > 1
        and words[-1] in ("id", "ids")
        and _SECRET_WORDS.intersection(words) == {"token"}
    )


def is_secret_query_name(name: str) -> bool:
    """Whether a URL's query parameter ``name`` holds a credential (``password``, ``sig``,
    ``X-Amz-Signature``, ``access_token``); ``host``, ``sslmode``, ``dbname`` do not.

    Its words (split as a field's) hold one of a field's secret words or pwd, pass, sig,
    signature, auth, authorization; or one ends in password, passwd, secret, token, apikey,
    accesskey, secretkey, privatekey, credential or signature; or its last word is ``key``.
    """
    words = _words(name)
    return bool(words) and (
        words[-1] == "key"
        or not _QUERY_SECRET_WORDS.isdisjoint(words)
        or any(word.endswith(_QUERY_SECRET_ENDINGS) for word in words)
    )


def redact_text(text: str) -> str:
    """``text`` with the userinfo of every URL in it replaced, and the value of every query
    parameter named like a credential
    (``https://<redacted>@host/x?sslmode=require&token=<redacted>``), and every credential this
    process holds in its environment (see :func:`environment_secrets`) wherever it appears."""
    return _scrubbed(text, environment_secrets())


def _scrubbed(text: str, secrets: list) -> str:
    if "://" in text:
        # The query first: the userinfo's "<redacted>" would end the URL as _URL reads it.
        text = _URL_USERINFO.sub(rf"\1{REDACTED}@", _URL.sub(_redacted_url, text))
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def _redacted_url(url: re.Match) -> str:
    return _QUERY_PARAM.sub(_redacted_param, url[0])


def _redacted_param(param: re.Match) -> str:
    separator, name, value = param.groups()
    if value and is_secret_query_name(name):
        return f"{separator}{name}={REDACTED}"
    return param[0]


# Shorter values are not taken for credentials: replacing "1" everywhere would garble text.
_SHORTEST_SECRET = 8


def environment_secrets() -> list:
    """The values of this process's environment variables whose names say they are secret
    (``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AZURE_STORAGE_KEY``, ...), longest
    first: an object store's client reads them, and an error it raises must not show them."""
    found = {
        value
        for name, value in os.environ.items()
        if len(value) >= _SHORTEST_SECRET and is_secret_name(name)
    }
    return sorted(found, key=len, reverse=True)


def _is_unset(value) -> bool:
    return value is None or (isinstance(value, str) and not value)


def _is_config_dict(value) -> bool:
    # Not imported here, so that `gatle-ignite --version` stays light: a value can only be a
    # ConfigDict once something else has imported ml_collections.
    module = sys.modules.get("ml_collections.config_dict")
    return module is not None and isinstance(value, module.ConfigDict)


def redact(value):
    """``value`` with secret-named fields and URL userinfo redacted, at any depth."""
    # The environment's credentials are looked up once for the whole value.
    return _redacted(value, environment_secrets())


def _redacted(value, secrets: list):
    if isinstance(value, dict) or _is_config_dict(value):
        return {
            _redacted(key, secrets): __redact_field(key, inner, secrets)
            for key, inner in value.items()
        }
    if isinstance(value, list):
        return [_redacted(item, secrets) for item in value]
    if isinstance(value, tuple):
        return tuple(_redacted(item, secrets) for item in value)
    if isinstance(value, str):
        return _scrubbed(value, secrets)
    return value


def __redact_field(name, value, secrets: list):
    # An unset credential stays visibly unset, so that a missing one can be noticed.
    if is_secret_name(name) and not _is_unset(value):
        return REDACTED
    return _redacted(value, secrets)


def is_secret_path(path: str) -> bool:
    """Whether the dotted field ``path`` is secret: it is, or lies within, a secret-named field."""
    return any(is_secret_name(part) for part in path.split("."))


def shown_value(path: str, value) -> str:
    """How an error message may show ``value`` of the dotted field ``path``: never a secret."""
    if is_secret_path(path) and not _is_unset(value):
        return REDACTED
    # The repr of what redact does not walk (a set, an object) is still scrubbed of URLs.
    return redact_text(repr(redact(value)))


def config_payload(cfg) -> dict:
    """The whole config as plain JSON types, with every secret field and URL userinfo redacted."""
    if hasattr(cfg, "to_json_best_effort"):
        plain = json.loads(cfg.to_json_best_effort())
    else:
        plain = json.loads(json.dumps(dict(cfg), default=str))
    return redact(plain)


def redact_argv(argv: Sequence[str]) -> list:
    """A command line's words as they may be shown: ``--override db_password=x``,
    ``--override=api_key=x`` and ``--token x`` lose their value, and every URL its userinfo.

    A ``key=value`` word (alone or after ``--flag=``) whose dotted key is secret shows
    ``key=<redacted>``; a literal dict or list value shows its secret-named fields redacted.
    """
    # The environment's credentials are looked up once for the whole line.
    secrets = environment_secrets()
    shown, secret_follows = [], False
    for word in map(str, argv):
        shown.append(REDACTED if secret_follows else _redacted_word(word, secrets))
        flag = _FLAG.fullmatch(word)
        secret_follows = bool(flag) and flag[2] is None and is_secret_name(flag[1].lstrip("-"))
    return shown


def shown_command(command: Union[str, Sequence[str]]) -> str:
    """A command line (its words, or the line itself) as one redacted, shell-quoted line."""
    if isinstance(command, str):
        try:
            command = shlex.split(command)
        except ValueError:  # an unbalanced quote: no shell would read it either
            command = command.split()
    return shlex.join(redact_argv(command))


def _redacted_word(word: str, secrets: list) -> str:
    flag = _FLAG.fullmatch(word)
    if flag is None or flag[2] is None:
        return _redacted_setting(word, secrets)
    if is_secret_name(flag[1].lstrip("-")):
        return f"{flag[1]}={REDACTED}"
    return f"{flag[1]}={_redacted_setting(flag[2], secrets)}"


def _redacted_setting(text: str, secrets: list) -> str:
    key, equals, raw = text.partition("=")
    if not equals or not _SETTING_KEY.fullmatch(key):
        return _scrubbed(text, secrets)
    value = _literal(raw)
    if is_secret_path(key.strip()) and not _is_unset(value):
        return f"{key}={REDACTED}"
    if isinstance(value, (dict, list, tuple)):
        redacted = _redacted(value, secrets)
        if redacted != value:
            return f"{key}={_scrubbed(repr(redacted), secrets)}"
    return f"{key}={_scrubbed(raw, secrets)}"


def _literal(raw: str):
    """The value an override's text stands for, as the config loader reads it."""
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


def redacted_excepthook(kind, error, trace) -> None:
    """``sys.excepthook`` for the CLI: Python's traceback, scrubbed of URL userinfo."""
    text = "".join(traceback.format_exception(kind, error, trace))
    print(redact_text(text), end="", file=sys.stderr, flush=True)


def redacted_thread_excepthook(args) -> None:
    """``threading.excepthook`` for the CLI: a thread's traceback, scrubbed as the main one."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "(unknown)"
    print(f"Exception in thread {name}:", file=sys.stderr, flush=True)
    redacted_excepthook(args.exc_type, args.exc_value, args.exc_traceback)
