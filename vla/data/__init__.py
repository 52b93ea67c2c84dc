"""Demonstrations on disk and in memory: collection, file formats (HDF5, LeRobot v3), sources over foreign
layouts, validation, conversion, and the training windows cut from them."""
