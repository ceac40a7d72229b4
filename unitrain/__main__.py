from unitrain.app import main
from unitrain.host.processes import run_command

if __name__ == "__main__":
    run_command(main)
