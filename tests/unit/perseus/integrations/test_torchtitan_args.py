"""`python -m perseus.integrations.torchtitan` takes torchtitan's own arguments and adds
only what makes its ``[perseus]`` section known (`with_config_module`); the module imports
without torchtitan (the real trainer runs in `tests/integration/frameworks`)."""

from __future__ import annotations

from dataclasses import fields

from perseus.integrations.torchtitan import JobConfig, PerseusConfig, with_config_module

THIS = "--job.custom_config_module=perseus.integrations.torchtitan"


def test_the_module_names_itself_as_torchtitans_config_module():
    argv = ["--job.config_file", "missing.toml", "--parallelism.pipeline_parallel_degree", "2"]
    assert with_config_module(argv) == [*argv, THIS]


def test_a_config_module_the_user_names_is_kept():
    for argv in (
        ["--job.custom_config_module", "mine"],
        ["--job.custom-config-module=mine"],
    ):
        assert with_config_module(argv) == argv


def test_a_config_file_that_names_a_config_module_is_kept(tmp_path):
    toml = tmp_path / "job.toml"
    toml.write_text('[job]\ncustom_config_module = "mine"\n')
    assert with_config_module([f"--job.config_file={toml}"]) == [f"--job.config_file={toml}"]
    toml.write_text('[job]\ndump_folder = "out"\n')
    assert with_config_module(["--job.config_file", str(toml)])[-1] == THIS
    toml.write_text("[job\n")  # torchtitan reports a broken file itself
    assert with_config_module(["--job.config_file", str(toml)])[-1] == THIS


def test_the_perseus_section_has_its_fields_and_defaults():
    section = JobConfig().perseus
    assert isinstance(section, PerseusConfig)
    assert {f.name for f in fields(PerseusConfig)} == {"enable", "server_url", "job_metadata"}
    assert section.enable and section.server_url == "" and section.job_metadata == ""
