"""The pieces of Paddle Fleet's parameter server (backends/paddle/ps.py): a trainer's client
made to work as unitrain runs it, the tables and their rules, the wide&deep program, passes the
engine runs, geo's evaluation of the servers' model, and what Fleet reports it ran."""
