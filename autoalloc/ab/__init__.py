"""The measurement half: ``AUTOALLOC_REPORT`` (recorder), ``autoalloc ab`` (runner, table, plot).

Nothing in the decision half imports this package; the hook imports ``recorder`` only
when ``AUTOALLOC_REPORT`` is set.
"""
