"""pytest runs the suite in two workers (pyproject.toml: -n 2, one test class per worker). Their
networks are tiny: torch's intra-op threads only contend with the other worker and with the
training processes the tests start, and a contended thread pool made small matmuls orders of
magnitude slower here. One thread per process, for every process the tests start too (they
inherit the environment); set before any test module imports torch."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
