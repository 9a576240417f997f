"""The JupyterLab extension in a real browser: status bar, "GPU slices" sidebar, resize from the
sidebar, the start dialog, the OOM line of a kernel at its cap, the server's warning about a slice
whose limits the kernel rewrote, JupyterLab's own kernel start refused (every kind of refusal,
read whole at 1280 px), two notebooks sharing the GPU with the shipped kernelspec's default size,
the launcher's logos, and the idle policy's notices (lowered, then stopped) told in the notebook,
against a live `jupyter lab` on the simulated GPU (8 GiB, 50 SMs)."""

from __future__ import annotations

import json

import pytest
from support import hold_outside, wait_for

GIB, MIB = 1 << 30, 1 << 20


def test_sliced_notebook_shows_usage_resizes_from_the_sidebar_and_reports_oom(lab, drive, screenshots, cuda_prelude):
    notebook = lab.write_notebook(
        "sliced.ipynb",
        [
            cuda_prelude + "print('allocated', allocate(300 << 20))",
            "print('total', memory()[1])",
            "print('big', allocate(3 << 30))",
        ],
    )

    seen = drive("slicedNotebook", notebook=notebook)

    assert "allocated 0" in seen["allocated"]
    assert seen["status"].startswith("GPU 0.3 / 1.0 GiB · SM ")
    assert seen["status"].endswith("/ 50 %")
    assert "GPU 0 Sim Browser GPU" in seen["sidebarDevice"]
    assert seen["invalid"] == {
        "text": "memory size 'lots' is not a size like 512MiB, 4GiB, 4G or a bare number of MiB",
        "refused": True,
    }
    assert seen["tooBig"]["refused"] and "Its 100GiB GPU slice can never fit" in seen["tooBig"]["text"]
    assert seen["granted"] == {"text": "Resized.", "refused": False}
    assert f"total {2 * GIB}" in seen["total"]
    assert "jupyter-vgpu: out of GPU memory in this slice" in seen["oom"]
    assert "--memory 4GiB" in seen["oom"] and "big 2" in seen["oom"]  # 2 = CUDA_ERROR_OUT_OF_MEMORY

    (slice_,) = [s for s in lab.api("GET", "api/vgpu/slices") if s["kernel_id"] == seen["kernelId"]]
    assert slice_["limits"]["memory_bytes"] == 2 * GIB
    assert slice_["path"] == "sliced.ipynb"
    assert all((screenshots / name).stat().st_size > 0 for name in ("sidebar.png", "statusbar.png"))


def test_start_dialog_refuses_a_bad_size_then_starts_a_kernel_of_the_chosen_size(lab, drive, cuda_prelude):
    seen = drive(
        "startDialog",
        memory="768MiB",
        cores="20",
        policy="burst",
        code=cuda_prelude + "print('total', memory()[1])",
    )

    assert "GPU 0 Sim Browser GPU: 8GiB free of 8GiB" in seen["free"]
    assert "memory size 'lots' is not a size like" in seen["invalid"]
    assert seen["status"] == "GPU 0 / 768 MiB · SM 0 / 20 %"
    assert f"total {768 * MIB}" in seen["total"]
    (slice_,) = lab.api("GET", "api/vgpu/slices")
    assert slice_["limits"] == {"memory_bytes": 768 * MIB, "cores": 20, "policy": "burst"}
    assert slice_["path"].startswith("Untitled") and slice_["path"].endswith(".ipynb")


def test_a_suspended_notebook_shows_in_the_sidebar_and_resumes_by_a_cell_or_the_resume_button(lab, drive, cuda_prelude):
    notebook = lab.write_notebook(
        "suspended.ipynb",
        [
            cuda_prelude + "print('allocated', allocate(300 << 20))",
            "print('again', allocate(1 << 20))",
            "print('still', allocate(1 << 20))",
        ],
    )

    # The filler leaves 512 MiB of the 8 GiB device while the notebook's 1 GiB slice is suspended.
    seen = drive("suspendResume", notebook=notebook, kernelName=lab.kernel_name, fillerMemory="7680MiB")

    assert (seen["runningButton"], seen["suspendedState"]) == ("Suspend", "suspended")
    assert seen["suspendedBar"] == "Memory 300MiB in host memory (suspended)"
    # Its bar holds nothing on the GPU (the server's usage still counts the 300 MiB it allocated),
    # and its dashed track says the memory is elsewhere; the status bar says where.
    assert seen["suspendedFill"] == 0 and seen["suspendedTrack"] == "dashed"
    assert seen["suspendedStatus"] == "GPU suspended · 300MiB in host memory"
    assert seen["suspendedTooltip"].splitlines()[1] == (
        "Suspended: 300MiB in host memory, none of it on the GPU; its next cell resumes it"
    )
    assert seen["suspendedButton"] == "Resume"
    assert "again 0" in seen["resumedByCell"]  # its next CUDA call resumed it
    assert seen["resumedFill"] > 0 and seen["resumedStatus"].startswith("GPU 0.3 / 1.0 GiB · SM ")
    assert seen["suspendedByButton"] == {"text": "Suspended.", "refused": False}
    assert seen["refused"]["refused"] and seen["refused"]["text"].startswith(
        f"kernel {seen['kernelId']!r} cannot resume yet: its 1GiB slice needs 1GiB on GPU 0, which has 512MiB free"
    ), seen["refused"]
    assert seen["resumedByButton"] == {"text": "Resumed.", "refused": False}
    assert "still 0" in seen["after"]
    (slice_,) = lab.api("GET", "api/vgpu/slices")
    assert (slice_["kernel_id"], slice_["state"], slice_["host_memory_bytes"]) == (seen["kernelId"], "running", 0)


def test_the_panel_shows_a_suspended_kernels_memory_label_whole(lab, drive, cuda_prelude):
    notebook = lab.write_notebook(
        "panel.ipynb", [cuda_prelude + "print('allocated', allocate(300 << 20))", "%vgpu panel"]
    )
    seen = drive("panelSuspended", notebook=notebook)
    assert seen["label"] == {"text": "300MiB in host memory (suspended)", "cut": False}


def test_memory_a_program_holds_outside_any_slice_shows_under_the_device_until_it_ends(lab, drive, browser_gpu_env):
    outside = hold_outside(browser_gpu_env, 2 * GIB)
    try:
        held = drive("deviceMemory")
    finally:
        outside.stdin.close()
        outside.wait(30)
    ended = drive("deviceMemory")

    assert held["lines"] == {"outside": "2GiB in use outside any slice"}
    assert held["device"].startswith("GPU 0 Sim Browser GPU: 6GiB free of 8GiB")
    assert ended["lines"] == {}
    assert ended["device"].startswith("GPU 0 Sim Browser GPU: 8GiB free of 8GiB")


def test_limits_rewritten_from_inside_the_kernel_show_as_a_warning_under_the_slice_and_in_the_status_bar(lab, drive):
    # What code in the kernel can do: its region file is writable by its Unix user.
    notebook = lab.write_notebook(
        "tampered.ipynb",
        [
            (
                "import os\n"
                "from jupyter_vgpu.holders.region import Region\n"
                "with Region.open(os.environ['VGPU_REGION']) as region:\n"
                "    region.set_limits(memory_limit=16 << 30, sm_share=100)\n"
                "print('rewritten')"
            ),
        ],
    )

    seen = drive("sliceWarning", notebook=notebook)

    (slice_,) = lab.api("GET", "api/vgpu/slices")
    assert slice_["warnings"], "the server did not flag the rewritten limits"
    assert seen["warnings"] == slice_["warnings"]  # each, whole, one line apiece
    assert seen["afterTitle"] == "jp-vgpu-Slice-title"
    assert seen["colours"]["text"] == seen["colours"]["warn"] != seen["colours"]["title"]
    assert seen["statusTooltip"].splitlines()[1:] == slice_["warnings"]
    assert slice_["limits"] == {"memory_bytes": GIB, "cores": 50, "policy": "hard"}  # restored


def test_notebooks_on_the_shipped_kernelspec_share_the_gpu_with_the_default_size(lab, drive):
    # "Python 3 (GPU slice)" sets no size, so the server's defaults size its kernels: a burst
    # fifth of the SMs and 4GiB each, so a second notebook starts beside the first (two fill the
    # test's 8 GiB device; the old default of all the SMs, hard, refused the second).
    notebooks = [
        lab.write_notebook(name, ["print('hello')"], kernelspec="python3-vgpu") for name in ("a.ipynb", "b.ipynb")
    ]

    seen = drive("notebooksSideBySide", notebooks=notebooks)["seen"]

    assert [shown["status"] for shown in seen] == ["GPU 0.0 / 4.0 GiB · SM 0 / 20 %"] * 2
    slices = {s["kernel_id"]: s for s in lab.api("GET", "api/vgpu/slices")}
    assert sorted(slices) == sorted(shown["kernelId"] for shown in seen)
    assert [(slices[shown["kernelId"]]["path"], slices[shown["kernelId"]]["limits"]) for shown in seen] == [
        (name, {"memory_bytes": 4 * GIB, "cores": 20, "policy": "burst"}) for name in notebooks
    ]


def test_the_launcher_s_gpu_slice_cards_show_logos_not_letters(lab, drive):
    # JupyterLab draws a Notebook card without an image as the label's first letter ("N", "P").
    seen = drive("launcherImages", cards=[SHIPPED_CARD, "New notebook on a GPU slice..."])

    assert {label: (card["letter"], card["imageWidth"] > 0) for label, card in seen.items()} == {
        SHIPPED_CARD: (0, True),
        "New notebook on a GPU slice...": (0, True),
    }, seen


def test_status_bar_has_no_gpu_item_for_a_kernel_without_a_slice(lab, drive):
    notebook = lab.write_notebook("plain.ipynb", ["print('no slice here')"], kernelspec="python3")

    seen = drive("plainNotebook", notebook=notebook)

    assert seen == {"statusItemVisible": False, "sidebar": "No kernel holds a GPU slice."}
    (session,) = lab.api("GET", "api/sessions")
    assert session["kernel"]["name"] == "python3"
    # The page can be done before the kernel is: a kernel stopped halfway through its start
    # keeps jupyter_client waiting for it well past the teardown's limit (seen on a busy
    # machine), which is not what this test is about. Asked over its own channels: the server's
    # execution_state stays "starting" once the page is gone, until a client talks to the kernel.
    lab.run_in_kernel(session["kernel"]["id"])


# What the lab adds under a refusal of a slice larger than any GPU: the server says "Ask for 8GiB or less",
# which a launcher card (the kernelspec's size) cannot.
SMALLER_SLICE_HINT = (
    'To start a notebook with a smaller slice: "New notebook on a GPU slice..." in the Launcher or the command palette.'
)


@pytest.mark.parametrize("lab_options", [("--VGPUApp.default_memory=9GiB",)])
def test_a_notebook_that_can_never_fit_says_why_in_a_readable_dialog_and_the_server_still_stops(lab, drive):
    # A full GPU is a line, not a refusal (test_a_new_notebook_on_a_full_gpu_waits_in_line...);
    # "Python 3 (GPU slice)" asks the server's default, here 9 GiB of the device's 8: never.
    filler = lab.api("POST", "api/vgpu/kernels", {"name": lab.kernel_name, "memory": "1GiB"})

    seen = drive("refusedStart", kernel="Python 3 (GPU slice)")
    slices = [s["kernel_id"] for s in lab.api("GET", "api/vgpu/slices")]
    # A refused start used to leave the server hanging on SIGTERM (stop() timed out after 30 s).
    stopped_in = lab.stop(timeout=15)

    message = seen["message"]
    problems = [
        problem
        for problem, found in [
            ("it does not say what the device has (8GiB)", "GPU 0 has 8GiB in all" not in message),
            ("it does not say what to do (ask for 8GiB or less)", "Ask for 8GiB or less" not in message),
            ("it doubles '%'", "%%" in message),
            (f"it does not say how to ask for less here: {seen['hints']}", seen["hints"] != [SMALLER_SLICE_HINT]),
            (f"it reads as a log, in {seen['font']}", "mono" in seen["font"].lower()),
            (f"the dialog must scroll to show it all: {seen['extent']}", not seen["inView"]),
            (f"the refused start holds a slice: {slices}", slices != [filler["kernel"]["id"]]),
            ("jupyter lab did not exit within 15 s of SIGTERM", stopped_in is None),
        ]
        if found
    ]
    assert not problems, (
        f"JupyterLab's dialog said {message!r}:\n- "
        + "\n- ".join(problems)
        + (f"\n--- lab log ---\n{lab.log.read_text()[-3000:]}" if stopped_in is None else "")
    )


# Each refusal a start from JupyterLab can meet on one server, whatever the GPU has free: the
# card clicked, the slices held first (memory, cores, policy) and what the refusal is about.
# "Python 3 (GPU slice)" asks the server's default (4GiB, a burst 20 %), "GPU slice (browser
# test)" 1GiB and a hard 50 %; the device has 8 GiB (device memory: the test above).
SHIPPED_CARD, TEST_CARD = "Python 3 (GPU slice)", "GPU slice (browser test)"
REFUSALS = {
    "largest slice": (SHIPPED_CARD, [], "a slice may have at most 2GiB of GPU memory on this server"),
    "server memory": (TEST_CARD, [("2GiB", 10, "burst"), ("1GiB", 10, "burst")], "may hold 3GiB of GPU memory"),
    "server slices": (TEST_CARD, [("512MiB", 10, "burst")] * 3, "allows at most 3 GPU slices"),
}


@pytest.mark.parametrize(
    "lab_options",
    [("--VGPUApp.max_memory=2GiB", "--VGPUApp.server_memory_limit=3GiB", "--VGPUApp.server_slice_limit=3")],
)
def test_every_kind_of_refused_start_is_read_whole_in_jupyterlab_s_dialog_at_1280_px(lab, drive):
    problems = []
    for kind, (card, held, about) in REFUSALS.items():
        fillers = [
            lab.api("POST", "api/vgpu/kernels", {"name": lab.kernel_name, "memory": m, "cores": c, "policy": p})
            for m, c, p in held
        ]
        spec = "python3-vgpu" if card == SHIPPED_CARD else lab.kernel_name
        _, said = lab.refusal("POST", "api/vgpu/kernels", {"name": spec})  # the server's whole message

        seen = drive("refusedStart", kernel=card, screenshot=f"refused-{kind.replace(' ', '-')}.png")

        if about not in said:
            problems.append(f"{kind}: the server refused for another reason: {said!r}")
        if seen["message"] != said:
            problems.append(f"{kind}: the dialog said {seen['message']!r}, not all of {said!r}")
        if not seen["inView"]:
            problems.append(f"{kind}: cut off: {seen['extent']}, message {seen['messageExtent']}")
        if seen["hints"]:  # a smaller slice is no answer to these (or not the only one)
            problems.append(f"{kind}: hinted {seen['hints']}")
        for filler in fillers:
            lab.api("DELETE", f"api/kernels/{filler['kernel']['id']}")
        wait_for(lambda: lab.api("GET", "api/vgpu/slices") == [], 60, "the held slices to be released")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("lab_options", [("--VGPUApp.idle_lower_after=1", "--VGPUApp.idle_cull_after=8")])
def test_an_idle_kernel_is_told_lowered_in_the_status_bar_then_stopped_in_a_notification(lab, drive):
    notebook = lab.write_notebook("idle.ipynb", ["print('never run')"])

    seen = drive("idleNotices", notebook=notebook)

    lowered = "lowered to 5% of the SMs after 1 s idle; restored when it runs again"
    assert seen["statusTooltip"].splitlines()[-1] == f"Idle kernel: {lowered}"
    assert seen["marker"]["dot"] == seen["marker"]["info"]
    assert seen["sidebarNotice"] == lowered
    assert seen["loweredToasts"] == [f"GPU slice of idle.ipynb: {lowered}"]
    stopped = "stopped after 8 s idle to free its 1GiB of GPU memory; start it again from the Kernel menu"
    assert seen["stoppedToasts"] == [f"The kernel of idle.ipynb: {stopped}"]
    assert lab.api("GET", "api/vgpu/notices") == {seen["kernelId"]: stopped}
    assert lab.api("GET", "api/vgpu/slices") == []


# What a waiting scenario prints once it has seen the kernel waiting: the test then frees the GPU.
ROOM_MARKER = "vgpu-test: free the GPU now"


def drive_until_room_comes(drive, scenario: str, env: dict[str, str], held: int, **settings) -> dict:
    """Drives ``scenario`` while a program outside any slice holds ``held`` bytes of the GPU; the
    program lets go when the scenario prints ROOM_MARKER, or at the end if it never did."""
    outside = hold_outside(env, held)

    def free_the_gpu():
        outside.stdin.close()
        outside.wait(30)

    try:
        return drive(scenario, when={ROOM_MARKER: free_the_gpu}, roomMarker=ROOM_MARKER, **settings)
    finally:
        if outside.poll() is None:
            free_the_gpu()


def test_a_new_notebook_on_a_full_gpu_waits_in_line_in_view_then_its_kernel_starts_by_itself(
    lab, drive, browser_gpu_env
):
    seen = drive_until_room_comes(
        drive,
        "waitingNotebook",
        browser_gpu_env,
        8 * GIB,  # the whole GPU
        kernel=TEST_CARD,
        code="print('ran', 6 * 7)",
        expected="ran 42",
    )

    print(json.dumps(seen, indent=1))  # what the page said, for a failure's report
    waiting, started = seen["waiting"], seen["started"]
    place = "1st in line for any GPU · waiting for 1GiB more GPU memory (0B free)"
    # While it waits: JupyterLab opened the notebook, no dialog; the status bar and the sidebar
    # say where its kernel stands, in the info colour; the tooltips say what queued means.
    assert waiting["dialogs"] == seen["dialogs"] == 0
    assert waiting["status"] == f"GPU queued · {place}"
    assert waiting["statusColour"]["text"] == waiting["statusColour"]["info"]
    assert waiting["statusTooltip"].splitlines() == [
        "GPU slice asked for on any GPU: memory cap 1GiB, SM share 50 % (hard)",
        (
            "Queued: the kernel waits in line for room on the GPU and starts by itself when there is room; "
            "shutting it down leaves the line"
        ),
        place,
    ]
    assert waiting["sidebarQueue"] == place
    assert waiting["sidebarTitle"] == f"{seen['path']} · any GPU · hard · queued"
    assert waiting["sidebarTitleTooltip"].splitlines()[2].startswith("Queued: the kernel waits in line")
    assert waiting["sidebarMemory"] == "Memory 1GiB asked for, not held yet (queued)"
    assert waiting["resizeFormShown"] is False
    assert waiting["kernelStatus"] != "idle", waiting  # JupyterLab's word for a kernel not started yet
    # Room came: the kernel started by itself, left the line, and ran a cell.
    assert started["status"] == "GPU 0.0 / 1.0 GiB · SM 0 / 50 %"
    assert started["sidebarState"] != "queued" and started["queueLineShown"] is False
    assert "ran 42" in started["output"]
    (slice_,) = lab.api("GET", "api/vgpu/slices")
    assert (slice_["kernel_id"], slice_["path"], slice_["queue"]) == (seen["kernelId"], seen["path"], None)


def test_a_resize_that_does_not_fit_waits_in_line_in_view_then_happens_by_itself(
    lab, drive, browser_gpu_env, cuda_prelude
):
    notebook = lab.write_notebook("growing.ipynb", [cuda_prelude + "print('allocated', allocate(300 << 20))"])
    seen = drive_until_room_comes(
        drive,
        "resizeWaits",
        browser_gpu_env,
        6 * GIB,  # of the 8 GiB
        notebook=notebook,
        memory="4GiB",
        grownBar="/ 4.0 GiB",
    )

    print(json.dumps(seen, indent=1))
    waiting, grown = seen["waiting"], seen["grown"]
    place = "1st in line for GPU 0"
    assert waiting["form"]["refused"] is False
    assert waiting["form"]["text"].startswith(f"Waits in line: {place} · waiting for ")
    assert waiting["form"]["text"].endswith("It happens by itself when room comes.")
    assert waiting["status"].startswith("GPU 0.3 / 1.0 GiB · SM ")
    assert waiting["status"].endswith(f" · resize {place}")
    assert waiting["sidebarQueue"].startswith(f"{place} · waiting for ")
    assert waiting["sidebarState"] == "running"
    assert grown["status"].startswith("GPU 0.3 / 4.0 GiB") and "resize" not in grown["status"]
    assert grown["queueLineShown"] is False
    (slice_,) = lab.api("GET", "api/vgpu/slices")
    assert (slice_["limits"]["memory_bytes"], slice_["queue"]) == (4 * GIB, None)
