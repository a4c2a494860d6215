#!/usr/bin/env python3
"""A minimal `sacct` for a Slurm cluster without accounting storage: answers from `scontrol show job`.

submitit calls `sacct -o JobID,State,NodeList --parsable2 -j ID [-j ID …]`; this prints the same table.
Finished jobs stay visible for MinJobAge seconds (setup_cluster.sh sets it to an hour).
"""

import subprocess
import sys


def job_fields(job_id: str) -> list[dict[str, str]]:
    """One dict per job record (array tasks give several) from `scontrol -o show job ID`."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True)
    if out.returncode != 0:
        return []
    records = []
    for line in out.stdout.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        records.append(fields)
    return records


def main(argv: list[str]) -> int:
    columns, jobs, i = ["JobID", "State", "NodeList"], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-o", "--format"):
            columns, i = argv[i + 1].split(","), i + 1
        elif arg in ("-j", "--jobs"):
            jobs.extend(argv[i + 1].split(","))
            i += 1
        elif arg.startswith("--format="):
            columns = arg.split("=", 1)[1].split(",")
        elif arg.startswith("--jobs="):
            jobs.extend(arg.split("=", 1)[1].split(","))
        i += 1
    print("|".join(columns))
    for job in jobs:
        for f in job_fields(job):
            array = f.get("ArrayJobId"), f.get("ArrayTaskId")
            job_id = f"{array[0]}_{array[1]}" if array[1] not in (None, "N/A") else f.get("JobId", job)
            values = {"JobID": job_id, "State": f.get("JobState", "UNKNOWN"), "NodeList": f.get("NodeList", ""),
                      "ExitCode": f.get("ExitCode", ""), "JobName": f.get("JobName", "")}
            print("|".join(values.get(c, "") for c in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
