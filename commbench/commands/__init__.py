"""One flow per command (report, compare, model, ceilings): what the command loads, what it
asks analyse/ for, what it hands report/ to print, and its exit status. The command line
(cli.py) parses the flags and dispatches here; report/ only turns numbers into text and
figures."""
