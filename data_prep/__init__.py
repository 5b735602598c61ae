"""Data preparation for mmrl: prompt parquet files for vision-language RL.

The row schema, its placeholders and ``Video`` are the library's (``mmrl.schema``); data prep imports
them from there and writes the files.

Modules:
    parquet    -- writing a prompt parquet file (rows checked against the schema).
    pixels     -- fitting images to a pixel budget and PNG encoding.
    synthetic  -- deterministic synthetic visual tasks (colour, count, shape).
    convert    -- converting a user's JSONL + image folder, quarantining bad rows.
    preferences -- synthetic preference pairs for reward-model training.

Import from the modules directly (e.g. ``from data_prep.pixels import
fit_pixel_budget``); this file imports nothing so that light users do not pay
for loading ``datasets``.
"""
