"""Analyses: measurements derived from the timeline model that several checks share."""
