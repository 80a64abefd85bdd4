"""Hardware: profile schemas, the catalog of shipped profiles, calibrations."""
