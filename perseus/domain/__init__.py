"""The pipeline domain: instruction kinds, schedules and their DAG, profiles, plans."""
