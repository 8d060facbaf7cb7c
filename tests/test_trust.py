"""Every file someone else may hand a user is data (docs/security.md): a config file cannot configure Hydra, name a
class outside RAIM's allow-lists, or carry a YAML constructor; every key of the composed config is checked on every
path; no module but the allow-lists turns a config node into an object. The commands answer each case in one line,
exit status 2, before anything runs."""

from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from test_cli_errors import cli

from src.io.config import ConfigError
from src.io.paths import CONF_DIR
from src.io.trust import check_sources, command_line
from src.studies.checked import check_config

ROOT = Path(__file__).resolve().parents[1]
GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())
FLAG = "FLAG"


def hostile(flag: Path) -> str:
    """A node that runs a command when Hydra's ``instantiate`` builds it (Hydra's blocklist lets it through)."""
    return f"_target_: uuid._get_command_stdout\n_args_: [touch, {flag}]\n"


@pytest.fixture
def conf(tmp_path) -> Path:
    """A copy of RAIM's conf/ to plant files in."""
    shutil.copytree(CONF_DIR, tmp_path / "conf")
    return tmp_path / "conf"


def refused(argv: list[str], conf: Path, *words: str) -> str:
    with pytest.raises(ConfigError) as e:
        check_sources(argv, conf)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


# ------------------------------------------------------------------------------------------ files as data


def test_the_shipped_configuration_and_every_option_pass(conf):
    check_sources([], conf)
    check_sources(["-m", *(f"{g}=glob(*)" for g in GROUPS)], conf)


def test_params_yaml_passes_as_the_dvc_stages_compose_it():
    check_sources(["--config-dir", str(ROOT), "--config-name", "params", "judge.compute=false"])


@pytest.mark.parametrize("group", GROUPS)
def test_a_node_that_would_run_a_command_is_refused_in_every_group(conf, tmp_path, group):
    (conf / group / "evil.yaml").write_text(hostile(tmp_path / FLAG))
    refused([f"{group}=evil"], conf, f"{group}/evil.yaml", "refused")


@pytest.mark.parametrize("group", GROUPS)
def test_a_group_file_cannot_configure_hydra(conf, group):
    """A global package would let a group file set ``hydra.callbacks`` (instantiated by Hydra itself, before any
    RAIM code), ``hydra.job_logging`` (a FileHandler writes where the file says), ``tracking.uri`` or ``output``."""
    (conf / group / "glob.yaml").write_text(
        "# @package _global_\nhydra:\n  callbacks:\n    x: {_target_: uuid._get_command_stdout}\n"
    )
    refused([f"{group}=glob"], conf, "@package")
    (conf / group / "hyd.yaml").write_text("hydra:\n  job_logging:\n    root: {level: INFO}\n")
    refused([f"{group}=hyd"], conf, "`hydra` node")


@pytest.mark.parametrize(
    "defaults",
    ["- override /hydra/job_logging: none", "- /tracking: evil", "- ../roster/cpu", "- {roster: cpu}"],
)
def test_a_group_files_defaults_name_only_its_own_options(conf, defaults):
    (conf / "stacker" / "d.yaml").write_text(f"defaults:\n  {defaults}\n  - _self_\nC: 1.0\n")
    refused(["stacker=d"], conf, "defaults")


def test_an_option_a_defaults_list_names_is_checked_too(conf, tmp_path):
    (conf / "analysis" / "inner.yaml").write_text(hostile(tmp_path / FLAG))
    (conf / "analysis" / "outer.yaml").write_text("defaults:\n  - default\n  - inner\n  - _self_\n")
    refused(["analysis=outer"], conf, "analysis/inner.yaml")


@pytest.mark.parametrize(
    "text",
    [
        "_target_: src.core.aggregate.StackedLogit\nC: !!python/object/apply:os.system ['touch FLAG']\n",
        "_target_: src.core.aggregate.StackedLogit\nC: !custom 1\n",
    ],
)
def test_a_yaml_constructor_tag_is_refused(conf, text):
    (conf / "stacker" / "tag.yaml").write_text(text)
    refused(["stacker=tag"], conf, "YAML tag")


@pytest.mark.parametrize(
    "group, text",
    [
        ("stacker", "_target_: src.core.aggregate.StackedLogit\nextra: {_target_: os.system}\n"),
        ("roster", "name: x\nmembers:\n  - name: a\n    backend: {_target_: os.system, _partial_: true}\n"),
        ("dataset", "name: x\nbuilder:\n  _target_: src.io.datasets.Fields\n  pairs: {_target_: os.system}\n"),
        ("frame", "name: x\nsystem: {_target_: builtins.open}\n"),
    ],
)
def test_a_target_stands_only_where_an_allow_list_builds_the_node(conf, group, text):
    (conf / group / "nested.yaml").write_text(text)
    refused([f"{group}=nested"], conf, "refused")


def test_a_folder_of_hydra_settings_is_refused(conf):
    (conf / "hydra" / "job_logging").mkdir(parents=True)
    (conf / "hydra" / "job_logging" / "evil.yaml").write_text("version: 1\n")
    refused([], conf, "hydra", "folder")


@pytest.mark.parametrize(
    "anchor, node, words",
    [
        ("  callbacks:\n", "    x: {_target_: uuid._get_command_stdout}\n", ("not a callback RAIM ships",)),
        ("  callbacks:\n", "    s: {_target_: src.run.SweepSummary, extra: 1}\n", ("unknown key",)),
        ("\nhydra:\n", "  job_logging:\n    handlers: {}\n", ("hydra.job_logging",)),
        ("\nhydra:\n", "  searchpath: [file:///tmp]\n", ("hydra.searchpath",)),
    ],
)
def test_the_primary_configs_hydra_node_holds_only_run_folders_and_raims_callbacks(conf, anchor, node, words):
    text = (conf / "config.yaml").read_text()
    assert text.count(anchor) == 1
    (conf / "config.yaml").write_text(text.replace(anchor, anchor + node))
    refused([], conf, *words)


@pytest.mark.parametrize(
    "extra, words",
    [
        ("hydra:\n  callbacks:\n    x: {_target_: uuid._get_command_stdout}\n", ("`hydra` node",)),
        ("defaults:\n  - stacker: logreg\n", ()),
        ("evil: {_target_: os.system}\n", ("refused",)),
    ],
)
def test_params_yaml_is_data_too(tmp_path, extra, words):
    """The DVC stages compose params.yaml (``--config-dir . --config-name params``): the file ``dvc exp run -S``
    writes and a pull request may change."""
    text = (ROOT / "params.yaml").read_text() + extra
    (tmp_path / "params.yaml").write_text(text)
    argv = ["--config-dir", str(tmp_path), "--config-name", "params"]
    if words:
        refused(argv, CONF_DIR, *words)
    else:  # a defaults list in a composition names a group option: that option is checked as any other
        check_sources(argv)


def test_an_option_is_a_name_in_its_group_never_a_path(conf):
    msg = refused(["dataset=../../../../etc/hostname"], conf, "no option")
    assert "options: all" in msg
    assert "did you mean 'wice'" in refused(["dataset=wic"], conf)


def own_folder(tmp_path: Path, option: str, text: str, group: str = "dataset") -> Path:
    """A user's own config folder, outside conf/, holding one option: what ``hydra.searchpath`` adds."""
    folder = tmp_path / "own_conf"
    (folder / group).mkdir(parents=True, exist_ok=True)
    (folder / group / f"{option}.yaml").write_text(text)
    return folder


def test_an_option_on_the_search_path_is_found_and_named_among_the_options(tmp_path):
    # a name no user's own conf/dataset/ holds (docs/own-benchmark.md's example is newbench)
    own = own_folder(tmp_path, "searchbench", (ROOT / "tests" / "fixtures" / "newbench" / "newbench.yaml").read_text())
    check_sources(["dataset=searchbench", f"hydra.searchpath=[file://{own}]"])
    check_sources(["dataset=searchbench", f"hydra.searchpath=[{own}]"])  # a plain path is a folder to Hydra too
    assert "no option 'searchbench'" in refused(["dataset=searchbench"], CONF_DIR)
    msg = refused(["dataset=searchbenc", f"hydra.searchpath=[file://{own}]"], CONF_DIR, "no option 'searchbenc'")
    assert "searchbench" in msg.split("options: ", 1)[1] and "did you mean 'searchbench'" in msg


@pytest.mark.parametrize(
    "text, words",
    [
        ("# @package _global_\nhydra:\n  callbacks:\n    x: {_target_: uuid._get_command_stdout}\n", ("@package",)),
        ("hydra:\n  job_logging:\n    root: {level: INFO}\n", ("`hydra` node",)),
        ("name: x\nsystem: {_target_: builtins.open}\n", ("refused",)),
        ("defaults:\n  - override /hydra/job_logging: none\n", ("defaults",)),
    ],
)
def test_a_file_on_the_search_path_is_data_as_conf_s_are(tmp_path, text, words):
    own = own_folder(tmp_path, "evil", text)
    refused(["dataset=evil", f"hydra.searchpath=[file://{own}]"], CONF_DIR, "own_conf/dataset/evil.yaml", *words)
    (own / "hydra" / "job_logging").mkdir(parents=True)
    (own / "hydra" / "job_logging" / "evil.yaml").write_text("version: 1\n")
    refused([f"hydra.searchpath=[file://{own}]"], CONF_DIR, "hydra", "folder")


@pytest.mark.parametrize(
    "value, words",
    [
        ("[pkg://src]", ("'pkg://src' is refused", "folders only")),
        ("[file:///nonexistent/raim/conf]", ("no such folder",)),
        ("[structured://]", ("'structured://' is refused",)),
        ("file:///tmp", ("a list of folders",)),
    ],
)
def test_a_search_path_entry_that_is_not_a_folder_is_refused(value, words):
    """A ``pkg://`` entry reads a Python package's files, which the check cannot see before Hydra does."""
    refused([f"hydra.searchpath={value}"], CONF_DIR, "hydra.searchpath", *words)


def test_the_command_line_is_read_as_hydra_reads_it():
    cl = command_line(["-cd", "/x", "--config-name=params", "--cfg", "job", "a=1", "-m", "b=2"])
    assert cl.config_name == "params" and cl.search[1] == Path("/x") and cl.overrides == ("a=1", "b=2")


# ------------------------------------------------------------------------------- the composed config


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def test_the_composed_default_config_passes():
    check_config(composed())


@pytest.mark.parametrize(
    "override, words",
    [
        ("+roster.members.0.backend.headers.Authorization=Bearer-x", ("unknown key 'headers'",)),
        ("+prevalence.windoww=3", ("unknown key 'windoww'", "did you mean 'window'")),
        ("+monitor.replay.degrade.accuracy.extra=1", ("unknown key 'extra'",)),
        ("+noise.simulation.typo=1", ("unknown key 'typo'",)),
        ("+rate.simulations.0.clusters=3", ("unknown key 'clusters'",)),
        ("+injection.attack=x", ("did you mean 'attacks'",)),
        ("+suite.cost.gpu=1", ("unknown key 'gpu'",)),
        ("+judge.ray.gpus=1", ("unknown key 'gpus'",)),
        ("+tracking.url=x", ("did you mean 'uri'",)),
        ("frame=def_on +frame.systm=x", ("did you mean 'system'",)),
        ("+evil=1", ("unknown key 'evil'",)),
        ("monitor.source=elsewhere", ("source='elsewhere'",)),
        ("stacker._target_=builtins.exec", ("not a stacker RAIM ships",)),
        ("analysis._target_=os.system", ("not a analysis settings RAIM ships",)),
        ("~dataset", ("no 'dataset' node",)),
    ],
)
def test_every_key_is_checked_on_every_path(override, words):
    """Whatever the command reads: a roster's backends are checked even when ``verdicts=`` means none is built."""
    cfg = composed(*override.split(), "verdicts=examples/simulated-panel.csv")
    with pytest.raises(ConfigError) as e:
        check_config(cfg)
    assert all(w in str(e.value) for w in words), str(e.value)


# --------------------------------------------------------------------------------------- one checked path


FORBIDDEN = ("hydra.utils", "hydra._internal.instantiate")


def instantiate_uses(source: str) -> list[str]:
    """Imports of Hydra's instantiate machinery in a module's source."""
    out = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "hydra":
            names = [f"hydra.{node.attr}"]
        out += [n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)]
    return out


def test_no_module_turns_a_config_node_into_an_object_but_through_an_allow_list():
    """``hydra.utils.instantiate`` imports and calls whatever ``_target_`` a node names; RAIM's allow-lists
    (:class:`src.io.config.Targets`) compare it with RAIM's own classes first."""
    bad = {
        str(p.relative_to(ROOT)): uses
        for p in sorted((ROOT / "src").rglob("*.py"))
        if (uses := instantiate_uses(p.read_text(encoding="utf-8")))
    }
    assert not bad, bad


@pytest.mark.parametrize(
    "source",
    [
        "from hydra.utils import instantiate",
        "import hydra.utils",
        "import hydra\nhydra.utils.call(x)",
        "from hydra import utils",
    ],
)
def test_the_check_sees_each_way_of_reaching_instantiate(source):
    assert instantiate_uses(source)


# ---------------------------------------------------------------------------------- through the commands

ENTRIES = (
    "src.run",
    "src.analyses",
    "src.rate",
    "src.prevalence",
    "src.monitor",
    "src.noise",
    "src.injection",
    "src.traces",
    "src.report",
)


def one_line_refusal(p, flag: Path) -> str:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), p.stderr[-2000:]
    assert not flag.exists(), "the hostile node ran"
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
def test_every_entry_refuses_a_hostile_node_in_every_group_in_one_line(tmp_path, conf, entry):
    """Each group it reads, and the two routes around the file check: a global package configuring Hydra's
    callbacks, and a class outside the allow-list where a node may name one."""
    flag = tmp_path / FLAG
    env = {"RAIM_CONF_DIR": str(conf)}
    cases = [f"{g}=evil" for g in GROUPS] + ["roster=glob", "stacker=alien", "roster=alien"]
    for g in GROUPS:
        (conf / g / "evil.yaml").write_text(hostile(flag))
    (conf / "roster" / "glob.yaml").write_text(
        f"# @package _global_\nhydra:\n  callbacks:\n    x:\n      _target_: uuid._get_command_stdout\n"
        f"      _args_: [touch, {flag}]\n"
    )
    (conf / "stacker" / "alien.yaml").write_text("_target_: uuid._get_command_stdout\n")
    (conf / "roster" / "alien.yaml").write_text(
        "name: alien\nmembers:\n  - name: a\n    backend: {_target_: uuid._get_command_stdout}\n"
    )
    for case in cases:
        one_line_refusal(cli(tmp_path, entry, case, "tracking.enabled=false", env=env), flag)


def test_an_option_on_the_search_path_is_composed(tmp_path):
    """A dataset kept in the user's own folder (``hydra.searchpath=[file://…]``) reaches the composed config."""
    spec = (ROOT / "tests" / "fixtures" / "newbench" / "newbench.yaml").read_text()
    own = own_folder(tmp_path, "searchbench", spec)  # conf/ comes first: a name no user's conf/dataset/ holds
    p = cli(tmp_path, "src.run", "dataset=searchbench", f"hydra.searchpath=[file://{own}]", "--cfg", "job")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "title: New benchmark" in p.stdout and "newbench/newbench.json" in p.stdout


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["src.run", "src.analyses"])
def test_a_hostile_file_on_the_search_path_is_refused_in_one_line(tmp_path, entry):
    """The routes a file in the user's own folder could take around the check: a global package configuring
    Hydra's callbacks, a node that runs a command, a dataset builder outside the allow-list."""
    flag = tmp_path / FLAG
    own = own_folder(tmp_path, "glob", f"# @package _global_\nhydra:\n  callbacks:\n    x:\n{_indent(hostile(flag))}")
    own_folder(tmp_path, "evil", hostile(flag))
    own_folder(tmp_path, "alien", f"name: alien\nframe: def_on\nbuilder:\n{_indent(hostile(flag), 2)}")
    own_folder(tmp_path, "outside", "name: outside\nframe: def_on\nbuilder: {_target_: uuid._get_command_stdout}\n")
    cases = [
        ("glob", "dataset/glob.yaml: an `# @package` directive is refused"),
        ("evil", "dataset/evil.yaml: _target_: a `_target_` here is refused"),
        ("alien", "dataset/alien.yaml: builder._args_: Hydra's instantiation key '_args_' is refused"),
        ("outside", "builder: _target_ 'uuid._get_command_stdout' is not a dataset builder RAIM ships"),
    ]
    for option, words in cases:
        p = cli(tmp_path, entry, f"dataset={option}", f"hydra.searchpath=[file://{own}]", "tracking.enabled=false")
        line = one_line_refusal(p, flag)
        assert words in line, line
    p = cli(tmp_path, entry, "dataset=wice", "hydra.searchpath=[pkg://src]", "tracking.enabled=false")
    assert "'pkg://src' is refused" in one_line_refusal(p, flag)


def _indent(text: str, n: int = 6) -> str:
    return "".join(" " * n + line + "\n" for line in text.splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
def test_every_entry_refuses_a_hostile_params_yaml_in_one_line(tmp_path, entry):
    flag = tmp_path / FLAG
    text = (ROOT / "params.yaml").read_text()
    (tmp_path / "params.yaml").write_text(
        text.replace("_target_: src.core.aggregate.StackedLogit", "_target_: os.system")
    )
    p = cli(tmp_path, entry, "--config-dir", str(tmp_path), "--config-name", "params", "tracking.enabled=false")
    assert "params.yaml: stacker" in one_line_refusal(p, flag)


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(
    "override, words",
    [
        ("stacker.CC=1", ("stacker has no key 'CC'", "did you mean 'C'")),
        ("dataset=nosuch", ("no option 'nosuch'",)),
        ("~dataset", ("no 'dataset' node",)),
        ("dataset=../../../../etc/hostname", ("no option",)),
    ],
)
def test_every_entry_answers_hydras_errors_in_one_line(tmp_path, entry, override, words):
    p = cli(tmp_path, entry, override, "tracking.enabled=false")
    line = one_line_refusal(p, tmp_path / FLAG)
    assert all(w in line for w in words), line


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_run_folder_hydra_cannot_make_is_one_line(tmp_path, entry):
    if os.geteuid() == 0:  # root writes anywhere (a locked folder would run the whole command): a path under a
        (tmp_path / "file").write_text("")  # file cannot be made by anyone
        unmakeable = tmp_path / "file" / "sub"
    else:
        (tmp_path / "locked").mkdir(mode=0o500)
        unmakeable = tmp_path / "locked" / "sub"
    p = cli(tmp_path, entry, "tracking.enabled=false", env={"RAIM_HYDRA_DIR": str(unmakeable)})
    line = one_line_refusal(p, tmp_path / FLAG)
    assert "sub" in line or "file" in line, line


def test_regenerating_params_yaml_reads_the_config_files_as_data_first(conf, tmp_path):
    """``python -m src.track params`` (what ``dvc exp run`` does) composes conf/ with DVC's Hydra: the same files,
    the same checks, before anything is composed."""
    (conf / "stacker" / "glob.yaml").write_text("# @package _global_\ntracking:\n  uri: sqlite:////tmp/elsewhere.db\n")
    out = tmp_path / "params.yaml"
    p = cli(tmp_path, "src.track", "params", "stacker=glob", "--out", str(out), env={"RAIM_CONF_DIR": str(conf)})
    assert "@package" in one_line_refusal(p, tmp_path / FLAG) and not out.exists()


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("+judge.api_key=x", ("judge", "api_key")),
        ("+stacker.maxiter=5", ("stacker", "maxiter")),
        ("+stacker.max_iter=5", ("stacker.max_iter", "already")),
    ],
)
def test_regenerating_params_yaml_refuses_a_composition_every_stage_would_refuse(tmp_path, override, words):
    """An override that composes (``+`` adds any key) but names a key no command knows, or one Hydra cannot
    compose, is refused in one line before params.yaml is written: the params.yaml already there stays as it
    was, and no staged file is left."""
    out = tmp_path / "params.yaml"
    out.write_text("kept: true\n")
    p = cli(tmp_path, "src.track", "params", override, "--out", str(out))
    line = one_line_refusal(p, tmp_path / FLAG)
    assert all(w in line for w in words), line
    assert out.read_text() == "kept: true\n" and sorted(x.name for x in tmp_path.iterdir()) == ["params.yaml"]
    assert cli(tmp_path, "src.track", "params", "stacker.C=0.5", "--out", str(out)).returncode == 0
    assert "C: 0.5" in out.read_text()


@pytest.mark.parametrize(
    "field", ["{evidence.__class__.__mro__}", "{candidate[0]}", "{question!r}", "{evidence:>99999}", "{x}"]
)
def test_a_frame_template_names_only_an_items_fields(conf, field):
    """``str.format`` follows attributes and indexes: a frame from someone else could read objects into the
    prompt sent to a judge's server."""
    text = (conf / "frame" / "def_on.yaml").read_text().replace("{evidence}", field, 1)
    (conf / "frame" / "fmt.yaml").write_text(text.replace("name: def_on", "name: fmt"))
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        cfg = compose(config_name="config", overrides=["frame=fmt"])
    with pytest.raises(ConfigError, match="replacement field"):
        check_config(cfg)
