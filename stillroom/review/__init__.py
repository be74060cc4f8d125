"""The reviewer's tools: a table recomputed from its recorded inputs, or one row traced to
its graded records (recompute.py, ``stillroom audit <table> --recompute / --cell``), and
the bundle a reviewer checks offline (bundle.py)."""
