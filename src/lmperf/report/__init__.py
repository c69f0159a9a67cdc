"""Reporting shared by every kind: the report CLI, formats, markdown, figures, cross-device comparison."""
