# 10,000 idle workers that only HEARTBEAT (every 3 s); emq-router's CPU
# from /proc/<pid>/stat over 20 s. Two bench processes of 5,000 workers
# each (file-descriptor limit); the second one measures, started once the
# first is connected; 3 runs (the figure varies by ±15 % from run to run).
MODE=idle
TARGETS="emq"
RUNS=3
IDLE_WORKERS=10000
IDLE_SECONDS=20
