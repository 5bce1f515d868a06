"""Numbers from rows: hardware profiles, ceilings, fits and scaling, the what-if model, compare's statistics."""
