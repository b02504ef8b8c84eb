"""The processes: `python -m dlcrepro <command>` (cli), the fork server its training jobs run in
(server), the heap settings every such process starts with, and the GPU check. The top layer; the
one import circle left is here (the server forks children that run the command line)."""
