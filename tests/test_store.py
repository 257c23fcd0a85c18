"""The results store under concurrent writers."""
import multiprocessing

from dpbench.results import store


def _append_after(barrier, path, index):
    barrier.wait()
    store.append({"run_id": str(index), "task": "t", "method": "m", "data_id": "d", "created_at": "0"}, path)


def test_processes_that_create_the_store_together_all_append(tmp_path):
    """Two writers opening a new file at once made SQLite refuse the WAL switch without waiting (CI, sweep): 23 of
    200 four-process pools failed before the retry, so 40 attempts miss it with probability below 1%."""
    context = multiprocessing.get_context("fork")
    writers = 4
    for attempt in range(40):
        path = tmp_path / f"results{attempt}.sqlite"
        barrier = context.Barrier(writers)
        processes = [context.Process(target=_append_after, args=(barrier, path, index)) for index in range(writers)]
        for process in processes:
            process.start()
        for process in processes:
            process.join()
        assert [process.exitcode for process in processes] == [0] * writers
        assert sorted(record["run_id"] for record in store.load(path)) == [str(i) for i in range(writers)]
