"""Reporting: tables, figures and markdown sections built from records (never from memory).

One module per kind of measurement (``e2e``, …) plus ``answers``, which assembles
report/answers.md from the section fragments every kind writes.
"""
