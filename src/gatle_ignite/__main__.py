import sys

from gatle_ignite.cli.main import main

sys.exit(main())
