#!/usr/bin/env python
# Django's manage.py; an installed wheel has the same command as `lineage` (config/manage.py).
from config.manage import main

if __name__ == "__main__":
    main()
