"""`python -m gateway.cli`: what the tests, the playground and the benchmarks run."""

import sys

from gateway.cli.main import main

sys.exit(main())
