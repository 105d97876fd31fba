"""`python -m roseinfer.trace_sql TRACE "SELECT ..."`."""

import sys

from roseinfer.trace_sql.cli import main

sys.exit(main())
