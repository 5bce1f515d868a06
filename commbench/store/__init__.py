"""Run directories, rows on disk, load(), and the importers of other tools' outputs."""
