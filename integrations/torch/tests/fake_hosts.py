"""COHORT_TEST_HOSTS=H fakes H hosts on this machine: consecutive ranks share one (COHORT_HOST),
so that the backend builds its hierarchical communicator (shared memory inside a fake host,
TCP between them). Import before init_process_group."""
import os

if int(os.environ.get("COHORT_TEST_HOSTS", "0")) > 0:
    per_host = int(os.environ["WORLD_SIZE"]) // int(os.environ["COHORT_TEST_HOSTS"])
    os.environ["COHORT_HOST"] = f"host{int(os.environ['RANK']) // per_host}"
