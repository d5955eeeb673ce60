"""run.json's text: the config is rendered once per run, the rest at every write, and the file
reads exactly as the indented JSON of the whole record would."""

import dataclasses
import json

from gatle_ignite.run.manifest import Manifest

CONFIG = {
    "name": "toy",
    "model_params": {"hidden": [16, 32], "note": "two\nlines", "empty": {}, "none": []},
    "db_url": "postgresql://user:pw@host/db?sslmode=require&password=hunter22",
    "save_dir": "/runs/toy",
}


def _whole(save_dir) -> str:
    return (save_dir / "run.json").read_text()


def test_run_json_is_the_indented_json_of_the_record_at_every_write(tmp_path):
    manifest = Manifest.new("toy", CONFIG, "0" * 12)
    for epoch in (1, 2):
        manifest.trained_epoch = epoch
        manifest.stop_reason = "see https://u:secret@example.com/x"
        manifest.write(tmp_path)
        text = _whole(tmp_path)
        data = json.loads(text)
        assert text == json.dumps(data, indent=2) + "\n"
        assert data["trained_epoch"] == epoch
        assert list(data) == [field.name for field in dataclasses.fields(Manifest)]
    assert data["config"]["model_params"] == CONFIG["model_params"]
    assert data["config"]["db_url"] == "<redacted>"
    assert "secret" not in text and "hunter22" not in text


def test_a_changed_config_is_rendered_again(tmp_path):
    manifest = Manifest.new("toy", CONFIG, "0" * 12)
    manifest.write(tmp_path)
    manifest.config = {**CONFIG, "save_dir": "/runs/elsewhere"}
    manifest.write(tmp_path)
    assert json.loads(_whole(tmp_path))["config"]["save_dir"] == "/runs/elsewhere"


def test_a_value_shaped_like_the_config_slot_is_kept_as_it_is(tmp_path):
    sly = "\0config"
    manifest = Manifest.new(sly, {**CONFIG, "name": sly}, "0" * 12)
    manifest.write(tmp_path)
    data = json.loads(_whole(tmp_path))
    assert data["name"] == sly and data["config"]["name"] == sly
