"""Checkers of the study's measurement targets: each reads results stores and prints PASS / FAIL / NOT
MEASURED per target with the figures behind it (`fast`: the fast CPU configurations, `method`: the
measurement method, `policy`: the adaptive K policies); none runs a model unless asked, none asserts."""
