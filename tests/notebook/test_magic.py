"""The %vgpu magic in IPython's own shell, talking to a scripted stand-in for the server's REST API
(tests/notebook/conftest.py)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from jupyter_vgpu.client import NOT_IN_A_SERVER, ServerClient, kernel_environment


def test_load_ext_registers_the_vgpu_line_magic(shell):
    assert shell.find_line_magic("vgpu") is not None


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_vgpu_help_prints_the_usage_and_asks_nothing(sliced_shell, fake_server, capsys, flag):
    """`%vgpu --help` (was: UsageError "unrecognized arguments: --help"; issue 27 #18)."""
    sliced_shell.run_line_magic("vgpu", flag)
    shown = capsys.readouterr().out
    assert "%vgpu [-h] [--memory MEMORY] [--cores CORES] [--policy POLICY]" in shown
    assert "``%vgpu resize --memory 6GiB --cores 40 --policy burst``" in shown
    assert fake_server.requests == []


def test_vgpu_prints_the_kernels_slice(sliced_shell, fake_server, capsys):
    sliced_shell.run_line_magic("vgpu", "")
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"GPU slice of train.ipynb ({fake_server.kernel_id}), running",
        "  device  1 · Sim Large",
        "  memory  512MiB used of 2GiB cap",
        "  SM      12.5% measured of 30% share",
        "  policy  burst",
    ]
    assert {request[3] for request in fake_server.requests} == {fake_server.credential}


def test_resize_sends_the_changes_and_prints_what_was_granted(sliced_shell, fake_server, capsys):
    sliced_shell.run_line_magic("vgpu", "resize --memory 6GiB --cores 40% --policy BURST")
    assert fake_server.requests[-1][:3] == (
        "PATCH",
        f"/base/api/vgpu/slices/{fake_server.kernel_id}",
        {"memory": "6GiB", "cores": 40, "policy": "burst"},
    )
    assert capsys.readouterr().out.strip() == "resize granted: memory cap 6GiB, SM share 40%, policy burst"


def test_vgpu_prints_what_the_server_warns_about_the_slice(sliced_shell, fake_server, capsys):
    fake_server.slice["warnings"] = ["limits changed from inside the kernel were restored"]
    sliced_shell.run_line_magic("vgpu", "")
    assert capsys.readouterr().out.splitlines()[-1] == "  warning limits changed from inside the kernel were restored"


def test_a_bare_number_is_sent_as_written_for_the_server_to_read_as_mib(sliced_shell, fake_server, capsys):
    sliced_shell.run_line_magic("vgpu", "resize --memory 6144")
    assert fake_server.requests[-1][2] == {"memory": "6144"}
    assert capsys.readouterr().out.strip() == "resize granted: memory cap 6GiB, SM share 30%, policy burst"


def test_the_kernel_credential_stays_out_of_the_clients_repr(fake_server):
    client = ServerClient.for_kernel(kernel_environment(fake_server.url, fake_server.kernel_id, fake_server.credential))
    assert client.kernel_id == fake_server.kernel_id
    assert fake_server.credential not in repr(client)


def test_resize_the_server_refuses_prints_its_reason(sliced_shell, fake_server, capsys):
    fake_server.refusal = (409, "device 1 has 3GiB of memory free; the slice asks for 4GiB more")
    sliced_shell.run_line_magic("vgpu", "resize --memory 6GiB")
    assert (
        capsys.readouterr().out.strip()
        == "resize refused: device 1 has 3GiB of memory free; the slice asks for 4GiB more"
    )


@pytest.mark.parametrize(
    "line, message",
    [
        ("resize --memory 6parsecs", "memory size '6parsecs' has an unknown unit 'parsecs'; use a size like 512MiB"),
        ("resize --memory=0", "memory size '0' must be more than zero"),
        ("resize --cores 140", "SM share '140' is not a whole percentage from 1 to 100"),
        ("resize --policy soft", "policy 'soft' is not 'hard'"),
        ("resize", "nothing to resize; give --memory, --cores and/or --policy"),
        ("--memory 6GiB", "belong to '%vgpu resize', not '%vgpu show'"),
        ("grow", "invalid choice: 'grow'"),
    ],
)
def test_bad_requests_are_refused_before_anything_is_sent(sliced_shell, fake_server, line, message):
    with pytest.raises(UsageError) as refused:
        sliced_shell.run_line_magic("vgpu", line)
    assert message in str(refused.value)
    assert fake_server.requests == []


def test_a_kernel_outside_a_vgpu_server_says_so(shell):
    with pytest.raises(UsageError) as refused:
        shell.run_line_magic("vgpu", "")
    assert str(refused.value) == NOT_IN_A_SERVER


def test_an_unreachable_server_is_named(shell, monkeypatch):
    for name, value in kernel_environment("http://127.0.0.1:9/", "kernel", "secret").items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=r"cannot reach the vGPU server at http://127.0.0.1:9/"):
        shell.run_line_magic("vgpu", "resize --cores 20")


def test_a_server_on_a_unix_socket_is_refused_plainly(shell, monkeypatch):
    for name, value in kernel_environment("http+unix://%2Ftmp%2Fjupyter.sock/", "kernel", "secret").items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match="not Unix sockets"):
        shell.run_line_magic("vgpu", "")


def test_vgpu_help_documents_every_action_and_option(shell):
    help_text = " ".join(shell.object_inspect_text("%vgpu").split())
    for documented in (
        "%vgpu resize --memory 6GiB --cores 40 --policy burst",
        "%vgpu panel",
        "{show,resize,panel}",
        "--memory MEMORY",
        "512MiB, 4GiB",
        "1 to 100",
        "'hard'",
        "credential",
    ):
        assert documented in help_text


def test_sliced_ipykernels_load_the_magic_and_other_kernels_are_left_alone():
    from jupyter_vgpu.provisioning.local import LOAD_MAGIC_ARGUMENT, with_vgpu_magic

    ipykernel = ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "kernel.json"]
    assert with_vgpu_magic(ipykernel) == [*ipykernel, LOAD_MAGIC_ARGUMENT]
    assert with_vgpu_magic(with_vgpu_magic(ipykernel)) == [*ipykernel, LOAD_MAGIC_ARGUMENT]  # restarts add it once
    assert with_vgpu_magic(["R", "--slave", "-e", "IRkernel::main()", "kernel.json"]) == [
        "R",
        "--slave",
        "-e",
        "IRkernel::main()",
        "kernel.json",
    ]


# -- a kernel started without a vGPU server (nbconvert, papermill, nbclient) ---------------------

BATCH_NOTE = "  note    started without a vGPU server (a batch run): its size was chosen when the run started"


def test_vgpu_in_a_kernel_no_server_started_shows_the_slice_from_its_region(batch_shell, capsys):
    shell, _ = batch_shell(memory=3 << 30, cores=40, policy="burst")
    shell.run_line_magic("vgpu", "")
    assert capsys.readouterr().out.splitlines() == [
        "GPU slice of kernel 7a0b1c2d (7a0b1c2d-0000-4000-8000-000000000007), unused",
        (
            "  state   unused: the slice is held, but no process of the kernel uses the GPU in it: none has made a "
            "CUDA call yet, or those that did have ended"
        ),
        "  device  0",
        "  memory  0B used of 3GiB cap",
        "  SM      0.0% measured of 40% share",
        "  policy  burst",
        BATCH_NOTE,
    ]


def test_vgpu_shows_limits_a_server_set_in_the_region_since(batch_shell, capsys, monkeypatch, tmp_path):
    # A batch kernel admitted to a server's ledger: the server may resize it; the region says so.
    shell, region = batch_shell(memory=3 << 30)
    monkeypatch.setenv("JUPYTER_VGPU_LEDGER", str(tmp_path / "ledger.sqlite"))
    region.set_limits(memory_limit=1 << 30, sm_share=25, policy="hard")
    shell.run_line_magic("vgpu", "")
    lines = capsys.readouterr().out.splitlines()
    assert lines[3:] == [
        "  memory  0B used of 1GiB cap",
        "  SM      0.0% measured of 25% share",
        "  policy  hard",
        BATCH_NOTE,
        f"  note    counted in the vGPU server's ledger {tmp_path / 'ledger.sqlite'}, beside the server's slices",
    ]


def test_a_region_without_a_cap_shows_none(batch_shell, capsys):
    shell, _ = batch_shell(memory=0)  # `jupyter vgpu run` without --memory
    shell.run_line_magic("vgpu", "")
    assert capsys.readouterr().out.splitlines()[3] == "  memory  0B used of no cap"


def test_resize_in_a_batch_kernel_says_how_to_choose_the_size_of_the_run(batch_shell, capsys, monkeypatch, tmp_path):
    shell, region = batch_shell()
    shell.run_line_magic("vgpu", "resize --memory 6GiB")
    said = capsys.readouterr().out.strip()
    assert said == (
        "resize refused: this kernel was started without a vGPU server (nbconvert, papermill, nbclient), so its "
        "slice cannot be resized from the notebook; choose the size when starting the run: jupyter nbconvert "
        "--execute --VGPUProvisioner.memory=6GiB ..., or papermill -k NAME with a kernelspec made by jupyter vgpu "
        "kernelspec install --memory 6GiB --name NAME"
    )
    assert region.limits.memory_limit == 3 << 30  # nothing changed
    monkeypatch.setenv("JUPYTER_VGPU_LEDGER", str(tmp_path / "ledger.sqlite"))
    shell.run_line_magic("vgpu", "resize --cores 20")
    assert (
        capsys.readouterr()
        .out.strip()
        .endswith(
            "Its slice is in the ledger of the vGPU server on this machine; while that server runs, it can resize it "
            "from a terminal: "
            "jupyter vgpu resize 7a0b1c2d --memory 3GiB"
        )
    )


def test_panel_in_a_batch_kernel_says_it_needs_a_server_without_failing_the_cell(batch_shell, capsys):
    shell, _ = batch_shell()
    shell.run_line_magic("vgpu", "panel")
    assert capsys.readouterr().out.strip() == (
        "%vgpu panel shows and resizes the slices of a vGPU server's kernels, and this kernel was started without a "
        "server (a batch run); %vgpu shows its own slice"
    )


def test_a_region_that_is_gone_is_named(batch_shell, monkeypatch, tmp_path):
    shell, _ = batch_shell()
    monkeypatch.setenv("VGPU_REGION", str(tmp_path / "gone.region"))
    with pytest.raises(UsageError) as refused:
        shell.run_line_magic("vgpu", "")
    assert (
        str(refused.value)
        == f"this kernel's GPU slice cannot be read: slice region {tmp_path / 'gone.region'} does not exist"
    )


def test_a_kernel_with_its_servers_link_asks_the_server_even_in_a_region(batch_shell, fake_server, monkeypatch, capsys):
    shell, _ = batch_shell()
    for name, value in kernel_environment(fake_server.url, fake_server.kernel_id, fake_server.credential).items():
        monkeypatch.setenv(name, value)
    shell.run_line_magic("vgpu", "")
    assert capsys.readouterr().out.splitlines()[0] == f"GPU slice of train.ipynb ({fake_server.kernel_id}), running"
