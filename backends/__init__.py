"""Framework backends. Each sub-package has the same module names, and is imported only when chosen."""
