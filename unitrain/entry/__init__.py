"""Scripts the frameworks' launchers start.

paddle.distributed.launch takes a script path, not a module, and puts the script's folder
first on sys.path; this folder holds nothing else, so no module of unitrain can shadow a
top-level name (``data``, ``config``...) of another library in the worker.
"""
