"""Console scripts: argument parsing and `main` only; the work lives in the packages they call."""
