"""The router's choice tables: the fit of measured GPU times, and the compiler that turns it into
the compact tables the package ships (capability_db/tables/<gpu>.json)."""
