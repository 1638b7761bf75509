"""What the forkserver readies once for every process forked from it.

``processes.py`` names this module as the forkserver's preload: the
forkserver imports the plane's modules and builds what compiling a first
policy set builds on first use (``serving.prepare``), so that a joining
process starts from them instead of building them again.
"""

import warden_server.app
import warden_server.plane  # noqa: F401  (imported for the processes forked)
from warden_server.policy.serving import prepare

prepare()
