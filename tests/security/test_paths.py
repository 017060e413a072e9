"""Paths are confined by the server: attacks on code paths, model dirs, storages and GPU types, refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hai_airflow.backends.common.confine import (
    PathRefused,
    PathRules,
    allowed_roots,
    confine,
    storage_problem,
)
from hai_airflow.backends.common.mounts import launch_mounts
from hai_airflow.server.config import ConfigError, parse_config
from hai_airflow.server.jobs.paths import local_code_path, watch_root
from hai_airflow.spec import CpuJobSpec
from tests.support import postgres
from tests.support.docker_engine import Engine
from tests.support.live_server import REPO, TEST_CONFIG, TOKENS, LiveServer

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


# ---- the rule itself ---------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """home/ (with two job dirs) and nas/{alice,bob}/ with a symlink from alice's to bob's."""
    for d in (
        "home/jobs/1/model",
        "home/jobs/2/model",
        "nas/alice/code",
        "nas/bob/code",
        "nas/groups/vision",
    ):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "nas/alice/to-bob").symlink_to(tmp_path / "nas/bob/code")
    (tmp_path / "nas/alice/to-etc").symlink_to("/etc")
    (tmp_path / "nas/alice/to-own").symlink_to(tmp_path / "nas/alice/code")
    return tmp_path


def rules(root: Path, own_job: int | None = None) -> PathRules:
    roots = allowed_roots([f"{root}/nas/{{user}}", f"{root}/nas/groups/{{group}}"], "alice", "vision")
    own = str(root / "home/jobs" / str(own_job)) if own_job else None
    return PathRules(allowed=roots, home=str(root / "home"), own_dir=own)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        pytest.param("/var/run", "system path /var/run", id="the Docker socket's directory"),
        pytest.param("/var/run/docker.sock", "system path /var/run", id="the Docker socket"),
        pytest.param("/", "root directory", id="the root directory"),
        pytest.param("/proc/1", "system path /proc", id="proc"),
        pytest.param("{root}/nas/alice/../bob/code", "'..'", id="dot-dot"),
        pytest.param("{root}/nas/bob/code", "outside the allowed roots", id="another user's dir"),
        pytest.param("{root}/nas", "outside the allowed roots", id="everyone's NAS"),
        pytest.param("{root}/nas/alice/to-bob", "resolves to", id="symlink out of the roots"),
        pytest.param("{root}/nas/alice/to-etc", "system path /etc", id="symlink to a system path"),
        pytest.param("{root}/home", "contains the server's $HAI_HOME", id="the server's home"),
        pytest.param("{root}", "contains the server's $HAI_HOME", id="above the server's home"),
        pytest.param("{root}/home/jobs/2/model", "outside this job's own directory", id="another job's dir"),
        pytest.param("relative/dir", "not an absolute path", id="relative"),
    ],
)
def test_the_rule_refuses_what_leaves_the_roots(tree: Path, path: str, why: str) -> None:
    with pytest.raises(PathRefused) as refused:
        confine(path.replace("{root}", str(tree)), rules(tree, own_job=1), "spec.model_dir")
    assert refused.value.field == "spec.model_dir" and why in refused.value.reason


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("{root}/nas/alice/code", id="own dir"),
        pytest.param("{root}/nas/alice/new/model", id="own dir not yet made"),
        pytest.param("{root}/nas/groups/vision", id="own group's dir"),
        pytest.param("{root}/nas/alice/to-own", id="symlink staying inside"),
        pytest.param("{root}/home/jobs/1/model", id="the job's own dir in $HAI_HOME"),
    ],
)
def test_the_rule_accepts_own_paths_and_resolves_symlinks(tree: Path, path: str) -> None:
    given = path.replace("{root}", str(tree))
    assert confine(given, rules(tree, own_job=1), "spec.code_path") == os.path.realpath(given)


def test_a_local_working_dir_may_contain_the_home_but_never_a_system_path(tree: Path) -> None:
    """Without a mount only the directory itself matters; a mount or a watched model dir shows all below."""
    open_rules = PathRules(allowed=None, home=str(tree / "home"))
    assert confine(str(tree), open_rules, "spec.code_path", whole_tree=False) == str(tree)
    for whole_tree in (False, True):
        with pytest.raises(PathRefused):
            confine("/", open_rules, "spec.code_path", whole_tree)
        with pytest.raises(PathRefused):
            confine("/etc/ssl", open_rules, "spec.code_path", whole_tree)


def test_system_paths_stay_refused_even_when_the_config_allows_everything(tree: Path) -> None:
    everything = PathRules(allowed=("/",), home=str(tree / "home"), protected=("/srv/engine.sock",))
    assert confine(str(tree / "nas/alice/code"), everything, "spec.code_path") == str(tree / "nas/alice/code")
    for path in ("/", "/var/run", "/run/docker.sock", "/etc", "/root/.ssh", "/srv", str(tree / "home")):
        with pytest.raises(PathRefused):
            confine(path, everything, "spec.code_path")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        pytest.param("{root}/data/10111", None, id="a data directory"),
        pytest.param("{root}/home/storage/10111", None, id="kept in $HAI_HOME beside the jobs"),
        pytest.param(
            "{root}/home/jobs/2", "outside this job's own directory", id="among the job directories"
        ),
        pytest.param("{root}", "contains the server's $HAI_HOME", id="above $HAI_HOME"),
        pytest.param("/var", "contains /var/run", id="above the Docker socket"),
        pytest.param("/etc/hai", "system path /etc", id="a system path"),
    ],
)
def test_a_configured_storage_is_mounted_only_where_it_exposes_no_system_or_server_state(
    tree: Path, path: str, why: str | None
) -> None:
    problem = storage_problem(path.replace("{root}", str(tree)), rules(tree, own_job=1))
    assert problem is None if why is None else why in (problem or "")


@pytest.mark.parametrize(
    ("user", "group", "expected"),
    [
        pytest.param("alice", "vision", ("/nas/alice", "/nas/groups/vision"), id="filled in"),
        pytest.param("../x", "vision", ("/nas/groups/vision",), id="a name that climbs is dropped"),
        pytest.param("a/b", "vision", ("/nas/groups/vision",), id="a name that descends is dropped"),
    ],
)
def test_roots_are_filled_in_per_user_and_group(user: str, group: str, expected: tuple[str, ...]) -> None:
    assert allowed_roots(["/nas/{user}", "/nas/groups/{group}"], user, group) == expected


@pytest.mark.parametrize(
    ("code_path", "local"),
    [
        pytest.param("https://git.example.com/team/x.git", None, id="https"),
        pytest.param("git@git.example.com:team/x.git", None, id="scp-like"),
        pytest.param("ssh://git@host/x.git", None, id="ssh"),
        pytest.param("/nas/bob/repo.git", "/nas/bob/repo.git", id="a local path"),
        pytest.param("file:///nas/bob/repo.git", None, id="a file URL (refused: not cloned at all)"),
        pytest.param("repo.git", "repo.git", id="relative (refused as not absolute)"),
    ],
)
def test_a_local_git_repository_obeys_the_roots_a_remote_one_is_not_a_path(
    code_path: str, local: str | None
) -> None:
    spec = CpuJobSpec(task_name="t", code_src="git", code_path=code_path, cmd="true")
    assert local_code_path(spec) == local


def test_the_checkpoint_watcher_never_scans_another_jobs_dir_or_the_root(tree: Path) -> None:
    """A model dir stored before these rules (or swapped since) is not scanned: nothing is adopted."""
    config = parse_config(f'[paths]\nallowed = ["{tree}/nas/{{user}}"]\n')
    home = tree / "home"

    def watch(model_dir: Path | str, job_id: int = 1) -> bool:
        return watch_root(config, home, "alice", "vision", job_id, str(model_dir)) is not None

    assert watch(home / "jobs/1/model") and watch(tree / "nas/alice/code")
    assert not watch(home / "jobs/2/model")  # another job's checkpoints
    assert not watch("/") and not watch(home) and not watch(tree / "nas/bob/code")
    assert not watch(tree / "nas/alice/to-bob")  # a symlink planted after submission


# ---- config ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        pytest.param(
            '[storages]\n10111 = "/data/p"\n', "storages.10111", "names no owners", id="bare storage"
        ),
        pytest.param(
            '[storages.10111]\npath = "/data/p"\ngroups = ["ghost"]\n',
            "storages.10111.groups",
            "ghost",
            id="unknown owner group",
        ),
        pytest.param('[paths]\nallowed = ["nas/{user}"]\n', "paths.allowed", "absolute", id="relative root"),
        pytest.param(
            '[paths]\nallowed = ["/nas/{uid}"]\n', "paths.allowed", "placeholder", id="bad placeholder"
        ),
    ],
)
def test_bad_paths_and_storages_config_names_the_field(text: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(text)
    assert e.value.field == field and words in e.value.problem


def test_gpu_types_of_nodes_and_packages_are_read_in_their_canonical_case() -> None:
    config = parse_config(
        '[[nodes]]\nname = "n"\ngpu_type = "a100"\n'
        '[[resource_packages]]\nid = 1\nname = "1xA100"\ngpu_type = "a100 "\n'
        "gpus = 1\ncpus = 4\nmemory_gb = 32\n"
    )
    assert config.nodes[0].gpu_type == config.resource_packages[0].gpu_type == "A100"


def test_a_bare_storage_stops_hai_serve_with_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(TEST_CONFIG + '\n[storages]\n10111 = "/data/projects/10111"\n', encoding="utf-8")
    env = {**os.environ, "HAI_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "hai_airflow.server", "--config", str(config), "--port", "1"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "storages.10111" in done.stderr and "[storages.<id>] path" in done.stderr
    assert not (tmp_path / "home" / "hai.db").exists()


# ---- against a live server ---------------------------------------------------------------------------


def confined_config(root: Path, backend: str = "local", backend_options: str = "") -> str:
    """TEST_CONFIG with per-user and per-group roots under root/nas and two owned storages."""
    text = TEST_CONFIG.replace('backend = "local"', f'backend = "{backend}"')
    if backend_options:
        text = text.replace("\n[[nodes]]", f"\n[backend]\n{backend_options}\n[[nodes]]", 1)
    return text + (
        f'\n[paths]\nallowed = ["{root}/nas/{{user}}", "{root}/nas/groups/{{group}}"]\n'
        f'\n[storages.10111]\npath = "{root}/nas/projects/10111"\ngroups = ["vision"]\n'
        f'\n[storages.10222]\npath = "{root}/nas/projects/10222"\nusers = ["dave"]\n'
    )


def make_tree(root: Path) -> None:
    for d in ("alice/code", "bob/code", "dave", "admin", "groups/vision", "projects/10111", "projects/10222"):
        (root / "nas" / d).mkdir(parents=True, exist_ok=True)
    (root / "nas/alice/to-bob").symlink_to(root / "nas/bob/code")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One confined `hai serve` per store for the attacks of this module."""
    root = tmp_path_factory.mktemp("confined")
    make_tree(root)
    env: dict[str, str] = {}
    if request.param == "postgresql":
        reason = postgres.unavailable_reason()
        if reason is not None:
            pytest.skip(reason)
        with postgres.temporary_database("hai_paths_test") as url:
            env["HAI_DATABASE_URL"] = url
            with LiveServer(root / "home", confined_config(root), env).start() as server:
                yield server
        return
    with LiveServer(root / "home", confined_config(root), env).start() as server:
        yield server


def root_of(live: LiveServer) -> Path:
    return live.home.parent


def submit(live: LiveServer, user: str, **spec: Any) -> httpx.Response:
    body: dict[str, Any] = {"mode": "standalone", "task_name": "t", "cmd": "true", "resource_pkg": 454}
    body.update(spec)
    if body["mode"] == "cpu":
        body.pop("resource_pkg")
    headers = {"Authorization": f"Bearer {TOKENS[user]}"}
    return httpx.post(f"{live.url}/api/v1/jobs", json={"spec": body}, headers=headers, timeout=30)


def job_ids(live: LiveServer) -> list[int]:
    with live.client(TOKENS["admin"]) as c:
        return [j.id for j in c.jobs(all=True, limit=100_000)]


def wait_state(live: LiveServer, job_id: int, states: set[str], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    with live.client(TOKENS["admin"]) as c:
        while True:
            job = c.job(job_id)
            if job.state in states:
                return job
            assert time.monotonic() < deadline, f"job {job_id} stayed {job.state}: {live.log_text()[-2000:]}"
            time.sleep(0.1)


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        pytest.param(
            {"code_path": "/var/run"}, "spec.code_path", "system path /var/run", id="code_path=/var/run"
        ),
        pytest.param(
            {"code_path": "{root}/nas/alice/../bob/code"}, "spec.code_path", "'..'", id="code_path dot-dot"
        ),
        pytest.param(
            {"code_path": "{root}/nas/bob/code"}, "spec.code_path", "outside", id="another user's code"
        ),
        pytest.param(
            {"code_path": "{root}/nas/alice/to-bob"}, "spec.code_path", "resolves to", id="symlink out"
        ),
        pytest.param({"code_path": "{home}"}, "spec.code_path", "$HAI_HOME", id="code_path=$HAI_HOME"),
        pytest.param(
            {"code_src": "git", "code_path": "{root}/nas/bob/code"},
            "spec.code_path",
            "outside",
            id="a git clone of another user's local repository",
        ),
        pytest.param(
            {"code_src": "git", "code_path": "file://{root}/nas/alice/code"},
            "spec.code_path",
            "file:// URLs are not cloned",
            id="a git clone by file URL",
        ),
        pytest.param({"model_dir": "/"}, "spec.model_dir", "root directory", id="model_dir=/"),
        pytest.param(
            {"model_dir": "../../1/model"}, "spec.model_dir", "'..'", id="relative model_dir climbs"
        ),
        pytest.param(
            {"model_dir": "{home}/jobs/1/model"}, "spec.model_dir", "own directory", id="another job's dir"
        ),
        pytest.param(
            {"model_dir": "{root}/nas/bob/model"}, "spec.model_dir", "outside", id="another user's model"
        ),
        pytest.param({"model_dir": "{root}/nas"}, "spec.model_dir", "outside", id="everyone's NAS"),
    ],
)
def test_a_path_attack_is_refused_with_422_and_nothing_is_written(
    live: LiveServer, spec: dict[str, str], field: str, words: str
) -> None:
    root = root_of(live)
    given = {"code_path": f"{root}/nas/alice/code"}
    given.update(
        {k: v.replace("{root}", str(root)).replace("{home}", str(live.home)) for k, v in spec.items()}
    )
    before = job_ids(live)
    listing = sorted(p.name for p in root.joinpath("nas").rglob("*"))
    r = submit(live, "alice", **given)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["field"] == field and words in body["error"] and body["fix"], body
    assert job_ids(live) == before
    assert sorted(p.name for p in root.joinpath("nas").rglob("*")) == listing  # no model dir was made


def test_own_and_group_paths_run_and_the_model_dir_is_where_asked(live: LiveServer) -> None:
    root = root_of(live)
    model = root / "nas/groups/vision" / f"model-{uuid.uuid4().hex[:6]}"
    r = submit(
        live, "alice", code_path=f"{root}/nas/alice/code", model_dir=str(model), cmd="touch $HAI_MODEL_DIR/x"
    )
    assert r.status_code == 201, r.text
    job = wait_state(live, r.json()["id"], TERMINAL)
    assert job.state == "SUCCEEDED", job.reason
    assert (model / "x").exists()


@pytest.mark.parametrize(
    ("user", "storage", "status"),
    [
        pytest.param("alice", 10111, 201, id="a member of the owning group"),
        pytest.param("dave", 10111, 403, id="another group's storage"),
        pytest.param("dave", 10222, 201, id="a named user"),
        pytest.param("bob", 10222, 403, id="a storage naming another user"),
        pytest.param("admin", 10222, 201, id="a platform admin mounts any"),
    ],
)
def test_project_storages_are_mounted_only_by_their_owners(
    live: LiveServer, user: str, storage: int, status: int
) -> None:
    before = job_ids(live)
    r = submit(live, user, mode="cpu", code_path=f"{root_of(live)}/nas/{user}", project_storage=[storage])
    assert r.status_code == status, r.text
    if status == 403:
        body = r.json()
        assert body["field"] == "spec.project_storage" and str(storage) in body["error"] and body["fix"]
        assert job_ids(live) == before  # the error names neither the storage's owners nor the user
    else:
        wait_state(live, r.json()["id"], TERMINAL)


@pytest.mark.parametrize("given", ["v100", " V100", "V100"])
def test_a_gpu_type_is_stored_in_its_canonical_case(live: LiveServer, given: str) -> None:
    root = root_of(live)
    r = submit(live, "alice", code_path=f"{root}/nas/alice/code", gpu_type=given)
    assert r.status_code == 201, r.text
    job = wait_state(live, r.json()["id"], TERMINAL)
    assert job.gpu_type == "V100" and job.spec["gpu_type"] == "V100"


def test_a_code_dir_swapped_for_a_symlink_after_submission_fails_the_job_at_launch(live: LiveServer) -> None:
    root = root_of(live)
    code = root / "nas/alice" / f"swap-{uuid.uuid4().hex[:6]}"
    code.mkdir()
    blocker = submit(live, "admin", code_path=str(root / "nas/admin"), resource_pkg=457, cmd="sleep 60")
    assert blocker.status_code == 201, blocker.text
    wait_state(live, blocker.json()["id"], {"RUNNING"})
    r = submit(live, "alice", code_path=str(code), resource_pkg=454, cmd="touch planted")
    assert r.status_code == 201, r.text
    assert wait_state(live, r.json()["id"], {"PENDING"}).state == "PENDING"  # behind the 8-GPU blocker
    code.rmdir()
    code.symlink_to(root / "nas/bob/code")
    with live.client(TOKENS["admin"]) as c:
        c.cancel(blocker.json()["id"])
    job = wait_state(live, r.json()["id"], TERMINAL)
    assert (
        job.state == "FAILED" and "spec.code_path" in (job.reason or "") and "outside" in (job.reason or "")
    )
    assert not (root / "nas/bob/code/planted").exists()


def test_a_queued_job_whose_storage_owner_was_removed_fails_at_launch(tmp_path: Path) -> None:
    """The config changed between submission and launch: the job fails instead of mounting the storage."""
    make_tree(tmp_path)
    config = confined_config(tmp_path)
    with LiveServer(tmp_path / "home", config).start() as live:
        blocker = submit(live, "admin", code_path=f"{tmp_path}/nas/admin", resource_pkg=457, cmd="sleep 60")
        wait_state(live, blocker.json()["id"], {"RUNNING"})
        r = submit(live, "bob", code_path=f"{tmp_path}/nas/bob/code", project_storage=[10111], cmd="true")
        assert r.status_code == 201, r.text
        live.stop()
        assert live.config_path is not None
        live.config_path.write_text(
            config.replace('groups = ["vision"]', 'groups = ["nlp"]'), encoding="utf-8"
        )
        live.start()
        with live.client(TOKENS["admin"]) as c:
            c.cancel(blocker.json()["id"])
        job = wait_state(live, r.json()["id"], TERMINAL)
        assert (
            job.state == "FAILED"
            and "project storage 10111" in (job.reason or "")
            and "bob" in (job.reason or "")
        )


# ---- against a real Docker engine --------------------------------------------------------------------


@pytest.fixture
def docker_server(
    docker_engine: Engine, busybox_image: str, tmp_path: Path
) -> Iterator[tuple[LiveServer, Any, str]]:
    """A confined `hai serve` on the docker backend (skipped without an engine)."""
    engine, image = docker_engine, busybox_image
    owner = f"hai-test-{uuid.uuid4().hex[:8]}"
    make_tree(tmp_path)
    options = f'docker_host = "{engine.url}"\nowner = "{owner}"\nvirtual_gpus = true\n'
    live = LiveServer(tmp_path / "home", confined_config(tmp_path, "docker", options)).start()
    try:
        yield live, engine, image
    finally:
        live.close()
        for c in engine.client.containers.list(all=True, filters={"label": f"hai.owner={owner}"}):
            c.remove(force=True)


def containers_of(engine: Any, job_id: int | None = None) -> list[Any]:
    """Containers of one job, or of every hai server, on the engine."""
    label = f"hai.job-id={job_id}" if job_id is not None else "hai.job-id"
    return list(engine.client.containers.list(all=True, filters={"label": label}))


@pytest.mark.docker
@pytest.mark.slow
def test_docker_code_path_var_run_is_refused_at_submit(docker_server: tuple[LiveServer, Any, str]) -> None:
    live, engine, image = docker_server
    for attack in ("/var/run", "/run", "/var/run/docker.sock", engine.url.removeprefix("unix://")):
        r = submit(live, "alice", code_path=attack, image=image, cmd="ls /var/run")
        assert r.status_code == 422, (attack, r.text)
        assert r.json()["field"] == "spec.code_path"
    assert job_ids(live) == [] and containers_of(engine) == []


@pytest.mark.docker
@pytest.mark.slow
def test_docker_a_symlink_swapped_in_after_submission_is_refused_at_launch(
    docker_server: tuple[LiveServer, Any, str],
) -> None:
    live, engine, image = docker_server
    root = root_of(live)
    code = root / "nas/alice/swap"
    code.mkdir()
    blocker = submit(
        live, "admin", code_path=str(root / "nas/admin"), resource_pkg=457, cmd="sleep 60", image=image
    )
    assert blocker.status_code == 201, blocker.text
    wait_state(live, blocker.json()["id"], {"RUNNING"})
    r = submit(live, "alice", code_path=str(code), cmd="ls /var/run/docker.sock", image=image)
    assert r.status_code == 201, r.text
    code.rmdir()
    code.symlink_to("/var/run")
    with live.client(TOKENS["admin"]) as c:
        c.cancel(blocker.json()["id"])
    job = wait_state(live, r.json()["id"], TERMINAL)
    assert job.state == "FAILED" and "spec.code_path" in (job.reason or "") and "/run" in (job.reason or "")
    assert containers_of(engine, r.json()["id"]) == []


@pytest.mark.docker
@pytest.mark.slow
def test_docker_backend_resolves_and_refuses_at_mount_time(
    docker_engine: Engine, busybox_image: str, tmp_path: Path
) -> None:
    """The backend's own check, right before the engine mounts: a swapped symlink, nothing created."""
    from hai_airflow.backends.common.base import JobEnvironment, Launch, StartError
    from hai_airflow.backends.docker.backend import DockerBackend
    from hai_airflow.scheduling.model import WorkerPlacement
    from hai_airflow.spec import StandaloneJobSpec

    engine, image = docker_engine, busybox_image
    owner = f"hai-test-{uuid.uuid4().hex[:8]}"
    make_tree(tmp_path)
    home, code = tmp_path / "home", tmp_path / "nas/alice/code"
    work = home / "jobs/7/instances/70"
    work.mkdir(parents=True)
    paths = PathRules(
        allowed=allowed_roots([f"{tmp_path}/nas/{{user}}"], "alice", "vision"),
        home=str(home),
        own_dir=str(home / "jobs/7"),
    )
    spec = StandaloneJobSpec(task_name="t", code_path=str(code), cmd="true", image=image, resource_pkg=454)
    launch = Launch(
        job_id=7, instance_id=70, spec=spec, placement=(WorkerPlacement(node="n", gpus=(0,)),),
        job=JobEnvironment(user="alice", group="vision", model_dir=home / "jobs/7/model"),
        log_path=work / "output.log", work_dir=work,
        paths=paths,
    )  # fmt: skip
    (home / "jobs/7/model").mkdir()
    assert {m.target for m in launch_mounts(launch)} == {str(work), str(code), str(home / "jobs/7/model")}
    shutil.rmtree(code)
    code.symlink_to("/var/run")
    backend = DockerBackend({"docker_host": engine.url, "owner": owner, "virtual_gpus": True}, home)
    try:
        with pytest.raises(StartError, match=r"spec\.code_path .* cannot be mounted: .*system path"):
            backend.start(launch)
        assert engine.client.containers.list(all=True, filters={"label": f"hai.owner={owner}"}) == []
    finally:
        backend.close()


@pytest.mark.parametrize(
    "link",
    [
        pytest.param("data/models", id="a relative link that stays beneath the root"),
        pytest.param("{root}/data/models", id="an absolute link into the root"),
        pytest.param("../../dave/m", id="a relative link that climbs out"),
        pytest.param("{tree}/dave/m", id="an absolute link out"),
    ],
)
def test_a_walk_beneath_a_root_follows_no_link_at_all(tmp_path: Path, link: str) -> None:
    """A link below the root is never followed, even one that stays inside: in a group share its
    members' dirs are swapped by whoever may write the share, to lead to another dir of the member."""
    from hai_airflow.backends.common.confine import open_beneath
    from hai_airflow.backends.common.safefs import UnsafeFile

    root = tmp_path / "nas" / "alice"
    (root / "data" / "models").mkdir(parents=True)
    (tmp_path / "nas" / "dave" / "m").mkdir(parents=True)
    (tmp_path / "dave" / "m").mkdir(parents=True)
    (root / "m").symlink_to(link.format(root=root, tree=tmp_path))
    with pytest.raises(UnsafeFile, match=r"/m is a symbolic link or not a directory"):
        open_beneath(str(root), str(root / "m" / "below"))
    fd = open_beneath(str(root), str(root / "data" / "models"))
    try:
        assert os.path.samestat(os.fstat(fd), (root / "data" / "models").stat())
    finally:
        os.close(fd)
    with pytest.raises(PermissionError):
        open_beneath(str(root), str(tmp_path / "dave" / "m"))
