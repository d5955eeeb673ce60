"""``python -m gatle_ignite.run.storage STAGING URL``: publish what a run left unpublished.

When the store stopped answering mid-run, the run ended with its last checkpoints in its local
staging directory and this command in its error message. It takes the run's lease, so no run
writes there meanwhile, and publishes the checkpoints the URL lacks, then the run's records
when they are further along than the URL's.
"""

import sys

from gatle_ignite.dispatch import ConfigError, report_config_error
from gatle_ignite.run.storage import StorageError, is_url, place_of


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not is_url(args[1]):
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    from gatle_ignite.run.storage.lease import Lease

    staging, url = args
    try:
        place = place_of(url, local=staging)
        lease = Lease(place)
        lease.acquire()
        try:
            if not place.holds_the_same_run():
                raise ConfigError(
                    f"{staging} does not hold the run {url} holds (their run.json ids differ, "
                    f"or one has none); nothing was published."
                )
            pushed = place.push_leftovers()
        finally:
            lease.release()
    except ConfigError as error:
        report_config_error(error)
        return 2
    except StorageError as error:
        print(f"storage error: {error}", file=sys.stderr)
        return 1
    print(f"PUBLISHED to {url}: {', '.join(pushed) or 'nothing (the store had it all)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
