"""The admin's dates as the rest of the console writes them (config/display.py, the templates' own
`Y-m-d H:i:s`), not Django's English "Dec. 4, 2026, 6:51 p.m.": one format on every page. FORMAT_MODULE_PATH
points here; what is not set falls back to Django's `en` (the input formats among them)."""

DATE_FORMAT = "Y-m-d"
DATETIME_FORMAT = "Y-m-d H:i:s"
TIME_FORMAT = "H:i:s"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i"
