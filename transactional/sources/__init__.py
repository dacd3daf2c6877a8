"""Ready-made sources: spouts over the stores users already have."""
