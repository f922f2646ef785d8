"""supervisor — the application: forks and watches workers, the dashboard, the `qw` CLI."""
