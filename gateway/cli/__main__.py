"""``python -m gateway.cli ...`` (the same as the ``switchyard`` console script)."""

from gateway.cli import run

if __name__ == "__main__":  # importing this module (pkgutil.walk_packages) runs nothing
    run()
