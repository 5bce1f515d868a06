"""The ground layer: errors, units, statistics, the row schema and the launch facts every layer reads."""
