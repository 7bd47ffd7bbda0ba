"""Data: the architecture catalogue (archs.json), each fact with its source; loaded by machine/catalogue.py."""
