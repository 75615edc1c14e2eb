"""inkfs benchmark harness: `bench/run --quick|--full|--smoke` (see bench/README.md)."""
