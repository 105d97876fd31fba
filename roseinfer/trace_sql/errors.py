"""The one error `trace-sql` reports to the user."""


class TraceQueryError(RuntimeError):
    """A trace that cannot be read, an engine that cannot run, or SQL that does not work."""
