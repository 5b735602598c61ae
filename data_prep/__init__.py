"""Data preparation for mmrl: prompt parquet files for vision-language RL.

Modules:
    schema     -- the row schema shared by every prompt parquet file, plus I/O.
    pixels     -- fitting images to a pixel budget and PNG encoding.
    synthetic  -- deterministic synthetic visual tasks (colour, count, shape).
    convert    -- converting a user's JSONL + image folder, quarantining bad rows.

Import from the modules directly (e.g. ``from data_prep.pixels import
fit_pixel_budget``); this file imports nothing so that light users do not pay
for loading ``datasets``.
"""
