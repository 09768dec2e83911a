"""File formats: the only readers and writers of profiles, plans and frontiers, one atomic writer."""
