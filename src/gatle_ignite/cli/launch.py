"""0.4's import path of the launcher, kept for the projects and tests that use it.

It is the same module object as :mod:`gatle_ignite.launch.launcher`, not a copy of its names,
so a patch through either name (``launch.run_task = ...``) is seen by both.
"""

import sys

from gatle_ignite.launch import launcher

sys.modules[__name__] = launcher
