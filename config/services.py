"""The old name of config/supervisor.py: `python -m config.services` runs the supervisor's main."""

import sys

from config.supervisor import main

if __name__ == "__main__":
    sys.exit(main())
