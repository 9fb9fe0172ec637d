# Worker scripts run as separate processes; pytest must not import them.
collect_ignore = ["train_compare.py", "features.py", "death.py", "mismatch.py", "ps_compare.py", "autotune.py",
                  "winning.py", "foreign.py", "uneven.py", "ending.py", "everyday_calls.py"]
