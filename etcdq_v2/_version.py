"""The version of etcdq_v2, defined here once.

setup.py reads this file without importing the package (which would need
its dependencies); ``etcdq --version`` and :data:`etcdq_v2.__version__`
import it; CHANGELOG.md's first section names it (tests/test_version.py).
A ``.devN`` version is what main holds on the way to that release.
"""
__version__ = "0.2.0.dev0"
