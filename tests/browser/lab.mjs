// One browser scenario against a running JupyterLab, for tests/browser/test_lab_extension.py:
//   node lab.mjs SCENARIO '{"url", "token", "chromium", "screenshots", ...scenario params}'
// Every wait has a deadline; a step that does not happen fails the scenario with what was awaited.
// The last line of stdout is a JSON object of what the scenario saw, for the Python side to check.

import { newPage, runScenario, settings, STEP_TIMEOUT } from './scenario.mjs';

/** JupyterLab at `path`; with `reset`, on an empty workspace (nothing an earlier page opened). */
async function openLab(browser, path, { reset = false } = {}) {
  const page = await newPage(browser);
  page.on('console', message => {
    if (['error', 'warning'].includes(message.type())) {
      console.error(`browser ${message.type()}: ${message.text()}`);
    }
  });
  await page.goto(`${settings.url}lab/${path}?token=${settings.token}${reset ? '&reset' : ''}`);
  await page.locator('#jp-main-dock-panel').waitFor();
  return page;
}

/**
 * Wait until the visible notebook's session has its kernel (a cell run before that is dropped:
 * CodeCell.execute needs session.kernel) and the kernel is idle. The GPU status item shows only
 * once the notebook's session.kernel is known and in a slice.
 */
async function waitForIdleKernel(page) {
  await page.locator('.jp-vgpu-StatusItem').waitFor();
  await page
    .locator('.jp-NotebookPanel:visible .jp-Notebook-ExecutionIndicator[data-status="idle"]')
    .waitFor();
}

/** A RegExp matching exactly `text` (a locator's hasText with a string matches substrings). */
function exactText(text) {
  return new RegExp(`^${text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`);
}

/** The launcher's Notebook section (one card a kernelspec). */
function notebookSection(page) {
  return page.locator('.jp-Launcher-section', {
    has: page.locator('.jp-Launcher-sectionTitle', { hasText: /^Notebook$/ })
  });
}

/** The launcher's Notebook card of the kernelspec shown as `label`. */
function notebookCard(page, label) {
  return notebookSection(page).locator('.jp-LauncherCard', {
    has: page.locator('.jp-LauncherCard-label', { hasText: exactText(label) })
  });
}

function cell(page, index) {
  return page.locator('.jp-NotebookPanel:visible .jp-Notebook .jp-Cell').nth(index);
}

/** Run a cell and wait until its output contains `expected` (a string or a RegExp). */
async function runCell(page, index, expected) {
  const target = cell(page, index);
  await target.locator('.jp-InputArea-editor').click();
  await page.keyboard.press('Shift+Enter');
  await target.locator('.jp-OutputArea-output', { hasText: expected }).first().waitFor();
  return target.locator('.jp-OutputArea').innerText();
}

async function statusText(page, expected) {
  const item = page.locator('.jp-vgpu-StatusItem', { hasText: expected });
  await item.waitFor();
  return item.innerText();
}

async function openSidebar(page) {
  await page.locator('.jp-SideBar.jp-mod-left [data-id="jupyter-vgpu-sidebar"]').click();
  await page.locator('#jupyter-vgpu-sidebar').waitFor();
}

function sliceRow(page, kernelId) {
  return page.locator(`#jupyter-vgpu-sidebar li[data-kernel-id="${kernelId}"]`);
}

/**
 * settings.notebook opened, its cell 0 run until its output has `expected`, then the sidebar
 * opened: the page and the notebook's kernel.
 */
async function firstCellRunWithSidebar(browser, expected) {
  const page = await openLab(browser, `tree/${settings.notebook}`);
  await waitForIdleKernel(page);
  await runCell(page, 0, expected);
  const kernelId = await kernelIdOf(page, settings.notebook);
  await openSidebar(page);
  return { page, kernelId };
}

/** Wait until the sidebar shows the slice in `state` (its row's data-state). */
async function sliceShownIn(page, kernelId, state) {
  await page.locator(`#jupyter-vgpu-sidebar li[data-kernel-id="${kernelId}"][data-state="${state}"]`).waitFor();
}

/** Wait for a slice row's inline message (after a resize, suspend or resume) and whether it is a refusal. */
async function rowMessage(row, expectedMessage) {
  const message = row.locator('.jp-vgpu-Message', { hasText: expectedMessage });
  await message.waitFor();
  return {
    text: await message.innerText(),
    refused: await message.evaluate(node => node.classList.contains('jp-vgpu-refused'))
  };
}

/** A REST call of the server, as another client of it (an admin, a script) makes it; its JSON or null. */
async function api(page, method, path, body) {
  return page.evaluate(
    async ({ url, token, method, path, body }) => {
      const response = await fetch(`${url}${path}`, {
        method,
        headers: { Authorization: `token ${token}` },
        body: body === undefined ? undefined : JSON.stringify(body)
      });
      const text = await response.text();
      if (!response.ok) {
        throw new Error(`${method} ${path}: ${response.status} ${text}`);
      }
      return text ? JSON.parse(text) : null;
    },
    { url: settings.url, token: settings.token, method, path, body }
  );
}

/** The kernel of the session the page opened for a notebook path. */
async function kernelIdOf(page, path) {
  const sessions = await page.evaluate(
    async ({ url, token }) => (await fetch(`${url}api/sessions?token=${token}`)).json(),
    settings
  );
  const session = sessions.find(s => s.path === path);
  if (!session) {
    throw new Error(`no session for ${path}: ${JSON.stringify(sessions)}`);
  }
  return session.kernel.id;
}

/** Submit the sidebar's resize form of a slice and wait for its inline message. */
async function resizeFromSidebar(page, kernelId, memory, expectedMessage) {
  const row = sliceRow(page, kernelId);
  await row.locator('input[name="memory"]').fill(memory);
  await row.locator('button.jp-vgpu-Apply').click();
  return rowMessage(row, expectedMessage);
}

/** Wait until the store has polled the slices `count` more times. */
async function nextPolls(page, count) {
  for (let poll = 0; poll < count; poll++) {
    await page.waitForResponse(response => response.url().includes('/api/vgpu/slices'));
  }
}

/**
 * Watch the visible notebook's kernel (window.jupyterapp: the lab runs with
 * --LabApp.expose_app_in_browser) for the next execute_request it sends and that request's first
 * stream output containing `marker`: their times (performance.now, in the page), every output text
 * of the request, and the status item's texts meanwhile. Read with firstLineSeen.
 */
async function watchFirstLine(page, marker) {
  await page.evaluate(marker => {
    const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    const probe = { sent: null, firstLine: null, id: null, outputs: [], done: false };
    window.vgpuProbe = probe;
    const slot = (_, { msg, direction }) => {
      if (direction === 'send' && msg.header.msg_type === 'execute_request' && probe.id === null) {
        probe.sent = performance.now();
        probe.id = msg.header.msg_id;
      } else if (direction === 'recv' && probe.id !== null && msg.parent_header?.msg_id === probe.id) {
        if (msg.header.msg_type === 'stream') {
          probe.outputs.push(msg.content.text);
          if (probe.firstLine === null && msg.content.text.includes(marker)) {
            probe.firstLine = performance.now();
          }
        } else if (msg.header.msg_type === 'status' && msg.content.execution_state === 'idle') {
          probe.done = true;
          kernel.anyMessage.disconnect(slot);
        }
      }
    };
    kernel.anyMessage.connect(slot);
  }, marker);
}

/** What watchFirstLine saw, once the cell ended: milliseconds from the request to its line, its outputs. */
async function firstLineSeen(page) {
  await page.waitForFunction(() => window.vgpuProbe.done);
  return page.evaluate(() => {
    const { sent, firstLine, outputs } = window.vgpuProbe;
    return { ms: firstLine === null ? null : firstLine - sent, outputs: outputs.join('') };
  });
}

/** From now on, every text the GPU status item shows, in window.vgpuStatusTexts. */
async function recordStatusTexts(page) {
  await page.locator('.jp-vgpu-StatusItem').evaluate(node => {
    window.vgpuStatusTexts = [node.textContent];
    new MutationObserver(() => {
      const text = node.textContent;
      if (window.vgpuStatusTexts.at(-1) !== text) {
        window.vgpuStatusTexts.push(text);
      }
    }).observe(node, { childList: true, characterData: true, subtree: true });
  });
}

async function sliceOf(page, kernelId) {
  const slices = await api(page, 'GET', 'api/vgpu/slices');
  return slices.find(s => s.kernel_id === kernelId);
}

async function sliceState(page, kernelId) {
  return (await sliceOf(page, kernelId))?.state;
}

/**
 * Wait (polling REST) until the kernel's slice reads running and out of the line: the slice
 * reads resuming while its memory comes back, and the kernel leaves the line (queue null) once
 * it is back. What it read on the way: [ms since `since`, state, queue position].
 */
async function sliceResumed(page, kernelId, since) {
  const deadline = Date.now() + STEP_TIMEOUT;
  const seen = [];
  for (;;) {
    const slice = await sliceOf(page, kernelId);
    const reading = [slice?.state, slice?.queue?.position ?? null];
    if (JSON.stringify(seen.at(-1)?.slice(1)) !== JSON.stringify(reading)) {
      seen.push([Date.now() - since, ...reading]);
    }
    if (reading[0] === 'running' && reading[1] === null) {
      return seen;
    }
    if (Date.now() > deadline) {
      throw new Error(`the slice of ${kernelId} did not resume: ${JSON.stringify(seen)}`);
    }
    await page.waitForTimeout(20);
  }
}

const scenarios = {
  /**
   * Resume ahead of use against resume-on-cell, on settings.notebook (cell 0 allocates the GPU
   * memory, cells 1 and 2 print settings.marker after a CUDA call). Its kernel suspended through
   * REST: the user clicks into cell 1 (the wake hint), and the kernel resumes with no cell run
   * (REST: running and out of the line), the status bar saying "GPU resuming" meanwhile; at least settings.hintLeadMs after the click, cell 1 runs
   * (timed: its execute_request to its first line). Then the wakeHint setting turned off (REST,
   * page reloaded), the kernel suspended again, cell 2 runs (timed the same way): its first CUDA
   * call resumes it, as before the hint. Cell 3 runs once on the running kernel, for the floor; then a
   * keystroke in cell 1 (the cursor there before a suspend) resumes the kernel too.
   */
  async resumeAhead(browser) {
    let page = await openLab(browser, `tree/${settings.notebook}`);
    await waitForIdleKernel(page);
    const allocated = await runCell(page, 0, 'allocated');
    const kernelId = await kernelIdOf(page, settings.notebook);
    const status = async () => page.locator('.jp-vgpu-StatusItem').innerText();
    const prompt = async index =>
      (await cell(page, index).locator('.jp-InputPrompt').innerText()).trim();

    // With the hint.
    await api(page, 'POST', `api/vgpu/slices/${kernelId}/suspend`);
    await statusText(page, 'GPU suspended');
    await recordStatusTexts(page);
    const clicked = Date.now();
    await cell(page, 1).locator('.jp-InputArea-editor').click();
    const restSeen = await sliceResumed(page, kernelId, clicked);
    const resumedAfterMs = restSeen.at(-1)[0];
    const kernelAfterWake = (await api(page, 'GET', `api/kernels/${kernelId}`)).execution_state;
    const promptAfterWake = await prompt(1);
    await page.locator('.jp-vgpu-StatusItem:not(.jp-vgpu-mod-resuming)').waitFor();
    const statusTexts = await page.evaluate(() => window.vgpuStatusTexts);
    const statusAfterWake = await status();
    const lead = settings.hintLeadMs - (Date.now() - clicked);
    if (lead > 0) {
      await page.waitForTimeout(lead); // the user reads their cell before running it
    }
    const hintedBefore = await sliceOf(page, kernelId); // just before its execute_request
    await watchFirstLine(page, settings.marker);
    await page.keyboard.press('Shift+Enter');
    const hinted = {
      ...(await firstLineSeen(page)),
      stateBefore: hintedBefore.state,
      queueBefore: hintedBefore.queue
    };
    hinted.prompt = await prompt(1);
    // The floor: the same cell again (3), its kernel running, not suspended since.
    await cell(page, 3).locator('.jp-InputArea-editor').click();
    await watchFirstLine(page, settings.marker);
    await page.keyboard.press('Shift+Enter');
    const running = await firstLineSeen(page);

    // An edit alone: the cursor already in cell 1 while the kernel runs (no hint), the kernel
    // suspended, then a keystroke there.
    await cell(page, 1).locator('.jp-InputArea-editor').click();
    await api(page, 'POST', `api/vgpu/slices/${kernelId}/suspend`);
    await statusText(page, 'GPU suspended');
    const typed = Date.now();
    await page.keyboard.type(' ');
    const resumedByEdit = await sliceResumed(page, kernelId, typed);

    // Without it: resume on the cell's first CUDA call.
    await api(page, 'PUT', 'lab/api/settings/jupyter-vgpu:plugin', {
      raw: JSON.stringify({ wakeHint: false })
    });
    await page.close();
    page = await openLab(browser, `tree/${settings.notebook}`);
    await waitForIdleKernel(page);
    await api(page, 'POST', `api/vgpu/slices/${kernelId}/suspend`);
    await statusText(page, 'GPU suspended');
    await cell(page, 2).locator('.jp-InputArea-editor').click();
    const unhintedState = await sliceState(page, kernelId);
    await watchFirstLine(page, settings.marker);
    await page.keyboard.press('Shift+Enter');
    const unhinted = { ...(await firstLineSeen(page)), stateBefore: unhintedState };
    await sliceResumed(page, kernelId, Date.now());
    return {
      kernelId,
      allocated,
      resumedAfterMs,
      restSeen,
      kernelAfterWake,
      promptAfterWake,
      statusTexts,
      statusAfterWake,
      hinted,
      unhinted,
      running,
      resumedByEdit
    };
  },

  /** A notebook on a sliced kernel: usage shows up, the sidebar resizes it, the cap's OOM line shows. */
  async slicedNotebook(browser) {
    const page = await openLab(browser, `tree/${settings.notebook}`);
    await waitForIdleKernel(page);
    const allocated = await runCell(page, 0, 'allocated 0');
    const kernelId = await kernelIdOf(page, settings.notebook);
    const status = await statusText(page, /GPU 0\.3 \/ 1\.0 GiB · SM \d+ \/ 50 %/);
    await page.locator('.jp-StatusBar-Widget').screenshot({ path: `${settings.screenshots}/statusbar.png` });

    await openSidebar(page);
    const row = sliceRow(page, kernelId);
    await row.locator('[data-bar="memory"]', { hasText: 'Memory 0.3 / 1.0 GiB' }).waitFor();
    const sidebarDevice = await page.locator('#jupyter-vgpu-sidebar .jp-vgpu-Device').first().innerText();

    const invalid = await resizeFromSidebar(page, kernelId, 'lots', 'is not a size like');
    const tooBig = await resizeFromSidebar(page, kernelId, '100GiB', 'can never fit');
    const granted = await resizeFromSidebar(page, kernelId, '2GiB', 'Resized.');
    await row.locator('[data-bar="memory"]', { hasText: 'Memory 0.3 / 2.0 GiB' }).waitFor();
    const total = await runCell(page, 1, 'total');
    const oom = await runCell(page, 2, 'out of GPU memory in this slice');
    await statusText(page, '/ 2.0 GiB');
    await page.screenshot({ path: `${settings.screenshots}/sidebar.png` });
    return { kernelId, allocated, status, sidebarDevice, invalid, tooBig, granted, total, oom };
  },

  /**
   * A growth that waits in line (issue 25): a notebook on a sliced kernel that allocated GPU
   * memory (cell 0); the sidebar's form grows it past what is free (a program outside any slice
   * holds the rest): the form says it waits, the status bar adds its place, the sidebar's queue
   * line says where it stands. Then it prints settings.roomMarker for the test to free the GPU,
   * and the resize happens by itself: the bar shows the new cap, the place is gone.
   */
  async resizeWaits(browser) {
    const { page, kernelId } = await firstCellRunWithSidebar(browser, 'allocated 0');
    const row = sliceRow(page, kernelId);
    const form = await resizeFromSidebar(page, kernelId, settings.memory, 'Waits in line');
    const item = page.locator('.jp-vgpu-StatusItem.jp-vgpu-mod-waiting');
    await item.waitFor();
    const queueLine = row.locator('.jp-vgpu-Queue');
    await queueLine.waitFor();
    const waiting = {
      form,
      status: await item.innerText(),
      sidebarQueue: await queueLine.innerText(),
      sidebarState: await row.getAttribute('data-state')
    };
    await page.screenshot({ path: `${settings.screenshots}/resize-waiting.png` });

    console.log(settings.roomMarker); // the test frees the GPU now
    await row.locator('[data-bar="memory"]', { hasText: settings.grownBar }).waitFor();
    await page.locator('.jp-vgpu-StatusItem:not(.jp-vgpu-mod-waiting)').waitFor();
    return {
      kernelId,
      waiting,
      grown: {
        status: await page.locator('.jp-vgpu-StatusItem').innerText(),
        queueLineShown: await queueLine.isVisible()
      }
    };
  },

  /**
   * A notebook on a sliced kernel that allocated GPU memory (cell 0), suspended through REST: the
   * sidebar shows it suspended with a Resume button, and its next cell (1) resumes it. Then the
   * sidebar's Suspend button suspends it, its Resume button is refused while another kernel
   * (settings.kernelName, settings.fillerMemory) holds the room, and resumes it once that is gone;
   * its last cell (2) runs on the GPU again.
   */
  async suspendResume(browser) {
    const { page, kernelId } = await firstCellRunWithSidebar(browser, 'allocated 0');
    const row = sliceRow(page, kernelId);
    const button = row.locator('button.jp-vgpu-Suspension');
    await sliceShownIn(page, kernelId, 'running');
    const runningButton = await button.innerText();

    const suspended = await api(page, 'POST', `api/vgpu/slices/${kernelId}/suspend`);
    await sliceShownIn(page, kernelId, 'suspended');
    const memoryBar = row.locator('[data-bar="memory"]');
    const suspendedBar = await memoryBar.locator('.jp-vgpu-Bar-label').innerText();
    // The GPU part of the bar: the fill's drawn width, and the track's border (dashed: in host memory).
    const suspendedFill = await memoryBar.locator('.jp-vgpu-Bar-fill').evaluate(node => node.getBoundingClientRect().width);
    const suspendedTrack = await memoryBar
      .locator('.jp-vgpu-Bar-track')
      .evaluate(node => getComputedStyle(node).borderTopStyle);
    const suspendedStatus = await statusText(page, 'suspended');
    const suspendedTooltip = await page.locator('.jp-vgpu-StatusItem').getAttribute('title');
    const suspendedButton = await button.innerText();
    await page.locator('#jupyter-vgpu-sidebar').screenshot({ path: `${settings.screenshots}/sidebar-suspended.png` });

    const resumedByCell = await runCell(page, 1, 'again 0');
    await sliceShownIn(page, kernelId, 'running');
    const resumedFill = await memoryBar.locator('.jp-vgpu-Bar-fill').evaluate(node => node.getBoundingClientRect().width);
    const resumedStatus = await statusText(page, 'GPU 0.3 / 1.0 GiB');

    await button.filter({ hasText: 'Suspend' }).click();
    const suspendedByButton = await rowMessage(row, 'Suspended.');
    await sliceShownIn(page, kernelId, 'suspended');
    const filler = await api(page, 'POST', 'api/vgpu/kernels', {
      name: settings.kernelName,
      memory: settings.fillerMemory
    });
    await button.filter({ hasText: 'Resume' }).click();
    const refused = await rowMessage(row, 'cannot resume yet');
    await api(page, 'DELETE', `api/kernels/${filler.kernel.id}`);
    await button.filter({ hasText: 'Resume' }).click();
    const resumedByButton = await rowMessage(row, 'Resumed.');
    await sliceShownIn(page, kernelId, 'running');
    const after = await runCell(page, 2, 'still 0');
    return {
      kernelId,
      runningButton,
      suspendedState: suspended.state,
      suspendedBar,
      suspendedFill,
      suspendedTrack,
      suspendedStatus,
      suspendedTooltip,
      suspendedButton,
      resumedByCell,
      resumedFill,
      resumedStatus,
      suspendedByButton,
      refused,
      resumedByButton,
      after
    };
  },

  /**
   * The sidebar's device once the store has polled twice: its text and its lines about memory no
   * slice was promised (data-memory: outside, over-cap) with their texts.
   */
  async deviceMemory(browser) {
    const page = await openLab(browser, '', { reset: true });
    await openSidebar(page);
    await nextPolls(page, 2);
    const device = page.locator('#jupyter-vgpu-sidebar .jp-vgpu-Device').first();
    await device.waitFor();
    const lines = {};
    for (const line of await device.locator('.jp-vgpu-DeviceMemory').all()) {
      lines[await line.getAttribute('data-memory')] = await line.innerText();
    }
    await page.locator('#jupyter-vgpu-sidebar').screenshot({ path: `${settings.screenshots}/sidebar-outside.png` });
    return { device: await device.innerText(), lines };
  },

  /**
   * A notebook whose kernel rewrites its own slice's limits (cell 0): the server's warning shows
   * under the slice's title in the sidebar, in the warn colour, and the status item turns to it.
   */
  async sliceWarning(browser) {
    const { page, kernelId } = await firstCellRunWithSidebar(browser, 'rewritten');
    const warning = sliceRow(page, kernelId).locator('.jp-vgpu-Warning');
    await warning.waitFor();
    const item = page.locator('.jp-vgpu-StatusItem.jp-vgpu-mod-warned');
    await item.waitFor();
    await page.locator('#jupyter-vgpu-sidebar').screenshot({ path: `${settings.screenshots}/sidebar-warning.png` });
    const colours = await warning.evaluate(node => ({
      text: getComputedStyle(node).color,
      // The theme's warn colour, resolved the same way.
      warn: (() => {
        const probe = document.createElement('span');
        probe.style.color = 'var(--jp-warn-color1)';
        node.append(probe);
        const colour = getComputedStyle(probe).color;
        probe.remove();
        return colour;
      })(),
      title: getComputedStyle(node.parentElement.previousElementSibling).color
    }));
    return {
      kernelId,
      warnings: await sliceRow(page, kernelId).locator('.jp-vgpu-Warning').allInnerTexts(),
      afterTitle: await warning.evaluate(node => node.parentElement.previousElementSibling.className),
      colours,
      statusTooltip: await item.getAttribute('title')
    };
  },

  /**
   * A notebook on a sliced kernel of a server with an idle policy: the kernel is left idle. Its
   * slice is lowered (the status item's marker and tooltip, the sidebar's line, one info
   * notification), then the kernel is stopped (one warning notification saying why).
   */
  async idleNotices(browser) {
    const page = await openLab(browser, `tree/${settings.notebook}`);
    await waitForIdleKernel(page);
    const kernelId = await kernelIdOf(page, settings.notebook);
    await openSidebar(page);
    const item = page.locator('.jp-vgpu-StatusItem.jp-vgpu-mod-noticed');
    await item.waitFor();
    const statusTooltip = await item.getAttribute('title');
    const marker = await item.evaluate(node => {
      const probe = document.createElement('span');
      probe.style.color = 'var(--jp-info-color1)';
      node.append(probe);
      const info = getComputedStyle(probe).color;
      probe.remove();
      return { dot: getComputedStyle(node, '::after').backgroundColor, info };
    });
    const sidebarNotice = await sliceRow(page, kernelId).locator('.jp-vgpu-Notice').innerText();
    const lowered = page.locator('.jp-Notification-Toast-info', { hasText: 'lowered to' });
    await lowered.first().waitFor();
    await page.locator('.jp-StatusBar-Widget').screenshot({ path: `${settings.screenshots}/statusbar-idle.png` });
    // Polls go on: the notice is told once.
    await nextPolls(page, 2);
    const loweredToasts = await lowered.allInnerTexts();
    const stopped = page.locator('.jp-Notification-Toast-warning', { hasText: 'stopped after' });
    await stopped.waitFor();
    // Its slice gone, the status item hides; the sidebar's row goes with it.
    await page.locator('.jp-vgpu-StatusItem').waitFor({ state: 'hidden' });
    await sliceRow(page, kernelId).waitFor({ state: 'detached' });
    await nextPolls(page, 2);
    await page.screenshot({ path: `${settings.screenshots}/idle-stopped.png` });
    return {
      kernelId,
      statusTooltip,
      marker,
      sidebarNotice,
      loweredToasts,
      stoppedToasts: await page.locator('.jp-Notification-Toast-warning').allInnerTexts()
    };
  },

  /**
   * Several notebooks opened one after another, each in its own tab, as a user opens them: every
   * one's kernel starts (no "Error Starting Kernel") and shows its slice in the status bar.
   */
  async notebooksSideBySide(browser) {
    const seen = [];
    for (const notebook of settings.notebooks) {
      const page = await openLab(browser, `tree/${notebook}`);
      // The lab may restore the notebooks an earlier tab opened: wait for this one to be current.
      await page
        .locator('.lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current', { hasText: notebook })
        .waitFor();
      const refusal = page.locator('.jp-Dialog', { hasText: 'Error Starting Kernel' });
      await Promise.race([
        waitForIdleKernel(page),
        refusal.waitFor().then(async () => {
          throw new Error(`${notebook}'s kernel did not start: ${await refusal.innerText()}`);
        })
      ]);
      seen.push({
        notebook,
        kernelId: await kernelIdOf(page, notebook),
        status: await statusText(page, / %$/)
      });
    }
    return { seen };
  },

  /** A notebook whose kernel has no slice: once a poll has seen the server, no GPU item shows. */
  async plainNotebook(browser) {
    const page = await openLab(browser, `tree/${settings.notebook}`);
    await page
      .locator('.jp-NotebookPanel:visible .jp-Notebook-ExecutionIndicator[data-status="idle"]')
      .waitFor();
    await page.waitForResponse(response => response.url().includes('/api/vgpu/slices'));
    await openSidebar(page);
    const sidebar = await page.locator('#jupyter-vgpu-sidebar .jp-vgpu-Status').innerText();
    return { statusItemVisible: await page.locator('.jp-vgpu-StatusItem').isVisible(), sidebar };
  },

  /**
   * A new notebook from the launcher's card of a sliced kernelspec (JupyterLab's own path:
   * POST /api/sessions) on a GPU without room: JupyterLab's "Error Starting Kernel" dialog, what
   * it says, and whether all of it is in view (no scrolling inside the dialog).
   */
  async refusedStart(browser) {
    const page = await openLab(browser, '', { reset: true });
    await notebookCard(page, settings.kernel).click();
    const dialog = page.locator('.jp-Dialog', {
      has: page.locator('.jp-Dialog-header', { hasText: 'Error Starting Kernel' })
    });
    const body = dialog.locator('.jp-Dialog-body');
    await body.waitFor();
    const pre = body.locator('pre').first();
    // The extension marks the dialog once it has rendered; its style then wraps the message.
    await dialog.and(page.locator('.jp-vgpu-mod-startRefusal')).waitFor();
    const message = await pre.innerText();
    // What the extension adds under a refusal that a smaller slice answers (added with the mark).
    const hints = await body.locator('.jp-vgpu-RefusalHint').allInnerTexts();
    const font = await pre.evaluate(node => getComputedStyle(node).fontFamily);
    const extentOf = node => ({
      scrollWidth: node.scrollWidth,
      clientWidth: node.clientWidth,
      scrollHeight: node.scrollHeight,
      clientHeight: node.clientHeight
    });
    const extent = await body.evaluate(extentOf);
    const messageExtent = await pre.evaluate(extentOf);
    // Within the dialog's own box too: a message that overflows its <pre> unclipped still sticks out.
    const messageInContent = await pre.evaluate(node => {
      const content = node.closest('.jp-Dialog-content').getBoundingClientRect();
      const text = node.getBoundingClientRect();
      return text.left >= content.left && text.right <= content.right && text.bottom <= content.bottom;
    });
    const shot = settings.screenshot ?? 'refused-start.png';
    await dialog.locator('.jp-Dialog-content').screenshot({ path: `${settings.screenshots}/${shot}` });
    await dialog.locator('.jp-Dialog-button.jp-mod-accept').click();
    await dialog.waitFor({ state: 'detached' });
    const fits = ({ scrollWidth, clientWidth, scrollHeight, clientHeight }) =>
      scrollWidth <= clientWidth && scrollHeight <= clientHeight;
    const inView = fits(extent) && fits(messageExtent) && messageInContent;
    return { message, hints, font, inView, extent, messageExtent, messageInContent };
  },

  /**
   * A new notebook from the launcher's card of a sliced kernelspec (settings.kernel) while the GPU
   * is full: JupyterLab opens it and its kernel waits in the line, its place in the status bar
   * and the sidebar, no "Error Starting Kernel" dialog. Then it prints `settings.roomMarker` for
   * the test to free the GPU; the kernel starts by itself (idle), its slice leaves the line, and
   * a cell runs (settings.code, whose output has settings.expected).
   */
  async waitingNotebook(browser) {
    const page = await openLab(browser, '', { reset: true });
    const errorDialog = page.locator('.jp-Dialog', { hasText: 'Error Starting Kernel' });
    // Any step that waits fails at once with the dialog's text if JupyterLab shows it.
    const withoutErrorDialog = step =>
      Promise.race([
        step,
        errorDialog.waitFor().then(async () => {
          throw new Error(`JupyterLab showed a dialog: ${await errorDialog.innerText()}`);
        })
      ]);
    await notebookCard(page, settings.kernel).click();
    const item = page.locator('.jp-vgpu-StatusItem.jp-vgpu-mod-queued');
    await withoutErrorDialog(item.waitFor());
    const path = await page
      .locator('.lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel')
      .innerText();
    const kernelId = await kernelIdOf(page, path);
    await openSidebar(page);
    const row = sliceRow(page, kernelId);
    await withoutErrorDialog(
      page.locator(`#jupyter-vgpu-sidebar li[data-kernel-id="${kernelId}"][data-state="queued"]`).waitFor()
    );
    const queueLine = row.locator('.jp-vgpu-Queue');
    await queueLine.waitFor();
    const waiting = {
      status: await item.innerText(),
      statusTooltip: await item.getAttribute('title'),
      statusColour: await item.evaluate(node => {
        const probe = document.createElement('span');
        probe.style.color = 'var(--jp-info-color1)';
        node.append(probe);
        const info = getComputedStyle(probe).color;
        probe.remove();
        return { text: getComputedStyle(node).color, info };
      }),
      sidebarTitle: await row.locator('.jp-vgpu-Slice-title').innerText(),
      sidebarTitleTooltip: await row.locator('.jp-vgpu-Slice-title').getAttribute('title'),
      sidebarQueue: await queueLine.innerText(),
      sidebarMemory: await row.locator('[data-bar="memory"] .jp-vgpu-Bar-label').innerText(),
      resizeFormShown: await row.locator('.jp-vgpu-ResizeForm').isVisible(),
      // JupyterLab's own word for the kernel meanwhile.
      kernelStatus: await page
        .locator('.jp-NotebookPanel:visible .jp-Notebook-ExecutionIndicator')
        .getAttribute('data-status'),
      dialogs: await page.locator('.jp-Dialog').count()
    };
    await page.screenshot({ path: `${settings.screenshots}/waiting-in-line.png` });

    console.log(settings.roomMarker); // the test frees the GPU now
    await withoutErrorDialog(
      page.locator('.jp-NotebookPanel:visible .jp-Notebook-ExecutionIndicator[data-status="idle"]').waitFor()
    );
    await withoutErrorDialog(
      page.locator(`#jupyter-vgpu-sidebar li[data-kernel-id="${kernelId}"]:not([data-state="queued"])`).waitFor()
    );
    await page.locator('.jp-vgpu-StatusItem:not(.jp-vgpu-mod-queued):not(.jp-vgpu-mod-waiting)').waitFor();
    await cell(page, 0).locator('.cm-content').fill(settings.code);
    const output = await withoutErrorDialog(runCell(page, 0, settings.expected));
    return {
      path,
      kernelId,
      waiting,
      started: {
        status: await page.locator('.jp-vgpu-StatusItem').innerText(),
        sidebarState: await row.getAttribute('data-state'),
        queueLineShown: await queueLine.isVisible(),
        output
      },
      dialogs: await page.locator('.jp-Dialog').count()
    };
  },

  /**
   * The launcher's Notebook cards named in settings.cards: whether each shows an image that
   * loaded (a logo), or the label's first letter, as JupyterLab draws a card without one.
   */
  async launcherImages(browser) {
    const page = await openLab(browser, '', { reset: true });
    const cards = {};
    for (const label of settings.cards) {
      const card = notebookCard(page, label);
      await card.waitFor();
      const image = card.locator('.jp-LauncherCard-icon img');
      cards[label] = {
        letter: await card.locator('.jp-LauncherCard-noKernelIcon').count(),
        // Loaded and drawn: a broken URL leaves naturalWidth 0.
        imageWidth: (await image.count())
          ? await image.evaluate(async img => {
              await img.decode().catch(() => undefined);
              return img.naturalWidth;
            })
          : 0
      };
    }
    await notebookSection(page).screenshot({ path: `${settings.screenshots}/launcher.png` });
    return cards;
  },

  /** The launcher's dialog: a refused size is explained, a good one starts a kernel of that size. */
  async startDialog(browser) {
    const page = await openLab(browser, '');
    await page.locator('.jp-LauncherCard', { hasText: 'New notebook on a GPU slice' }).click();
    const dialog = page.locator('.jp-Dialog');
    const free = await dialog.locator('.jp-vgpu-Devices').innerText();
    await dialog.locator('input[name="memory"]').fill('lots');
    await dialog.locator('.jp-Dialog-button.jp-mod-accept').click();
    const invalid = await dialog.locator('.jp-vgpu-Message', { hasText: 'is not a size like' }).innerText();
    await dialog.locator('input[name="memory"]').fill(settings.memory);
    await dialog.locator('input[name="cores"]').fill(settings.cores);
    await dialog.locator('select[name="policy"]').selectOption(settings.policy);
    await dialog.locator('.jp-Dialog-button.jp-mod-accept').click();
    await waitForIdleKernel(page);
    const status = await statusText(page, `/ ${settings.cores} %`);
    await cell(page, 0).locator('.cm-content').fill(settings.code);
    const total = await runCell(page, 0, 'total');
    return { free, invalid, status, total };
  },

  /**
   * %vgpu panel in settings.notebook (cell 0 allocates GPU memory, cell 1 shows the panel); the
   * kernel suspended through REST while the panel refreshes in its own thread (no cell runs, so
   * nothing resumes it): its row's memory label, and whether the page cuts it.
   */
  async panelSuspended(browser) {
    const page = await openLab(browser, `tree/${settings.notebook}`);
    await waitForIdleKernel(page);
    await runCell(page, 0, 'allocated 0');
    await runCell(page, 1, 'memory used / cap');
    const kernelId = await kernelIdOf(page, settings.notebook);
    await api(page, 'POST', `api/vgpu/slices/${kernelId}/suspend`);
    const label = cell(page, 1)
      .locator('.widget-label, .widget-html-content', { hasText: 'in host memory' })
      .first();
    await label.waitFor();
    return {
      label: await label.evaluate(node => ({
        text: node.textContent,
        cut: node.scrollWidth > node.clientWidth
      }))
    };
  },

  /**
   * A notebook whose kernel holds GPU memory (cell 0) on a GPU that copies checkpoints slowly:
   * suspended from the sidebar, then resumed by another client (REST). While its memory moves the
   * sidebar and the status bar say suspending, then resuming; the row's "Suspended." goes once
   * the kernel runs again. Then resized from the sidebar ("Resized.") and by another client to
   * settings.otherMemory: the row's message goes with the limits it was about.
   */
  async suspendingResuming(browser) {
    const { page, kernelId } = await firstCellRunWithSidebar(browser, 'allocated 0');
    const row = sliceRow(page, kernelId);
    const label = () => row.locator('[data-bar="memory"] .jp-vgpu-Bar-label').innerText();
    const message = () => row.locator('.jp-vgpu-Message').innerText();
    await sliceShownIn(page, kernelId, 'running');
    await recordStatusTexts(page);

    await row.locator('button.jp-vgpu-Suspension', { hasText: 'Suspend' }).click();
    await sliceShownIn(page, kernelId, 'suspending');
    const suspending = {
      title: await row.locator('.jp-vgpu-Slice-title').innerText(),
      bar: await label(),
      status: await statusText(page, 'GPU suspending')
    };
    const suspended = await rowMessage(row, 'Suspended.');
    await sliceShownIn(page, kernelId, 'suspended');

    // Another client resumes it; its answer comes once the memory is back.
    const resume = api(page, 'POST', `api/vgpu/slices/${kernelId}/resume`);
    await sliceShownIn(page, kernelId, 'resuming');
    const resuming = {
      title: await row.locator('.jp-vgpu-Slice-title').innerText(),
      bar: await label(),
      status: await statusText(page, 'GPU resuming'),
      // What the row says meanwhile: "Suspended." no longer holds.
      message: await message()
    };
    await page.locator('.jp-StatusBar-Widget').screenshot({ path: `${settings.screenshots}/statusbar-resuming.png` });
    await page.locator('#jupyter-vgpu-sidebar').screenshot({ path: `${settings.screenshots}/sidebar-resuming.png` });
    await resume;
    await sliceShownIn(page, kernelId, 'running');
    const afterResume = { message: await message(), status: await statusText(page, /^GPU \d/) };

    const resized = await resizeFromSidebar(page, kernelId, settings.memory, 'Resized.');
    await api(page, 'PATCH', `api/vgpu/slices/${kernelId}`, { memory: settings.otherMemory });
    await row.locator('[data-bar="memory"]', { hasText: `/ ${settings.otherMemoryShown}` }).waitFor();
    const afterOtherResize = await message();
    return {
      kernelId,
      suspending,
      suspended,
      resuming,
      afterResume,
      resized,
      afterOtherResize,
      statusTexts: await page.evaluate(() => window.vgpuStatusTexts)
    };
  },

  /**
   * The launcher's "New notebook on a GPU slice..." dialog: for each kernelspec of
   * settings.kernels (its display name), the memory and SM placeholders and the policy the form
   * shows; then a start with the last one and nothing typed: the notebook opens and the launcher
   * tab that ran the command is gone, as after JupyterLab's own notebook cards.
   */
  async startDialogDefaults(browser) {
    const page = await openLab(browser, '', { reset: true });
    const launcherTabs = () =>
      page.locator('.lm-DockPanel-tabBar .lm-TabBar-tabLabel', { hasText: exactText('Launcher') }).count();
    const card = page.locator('.jp-LauncherCard', { hasText: 'New notebook on a GPU slice' });
    await card.waitFor();
    const launchersBefore = await launcherTabs();
    await card.click();
    const dialog = page.locator('.jp-Dialog');
    const shown = {};
    for (const kernel of settings.kernels) {
      await dialog.locator('select').first().selectOption({ label: kernel }); // the kernelspec
      shown[kernel] = {
        memory: await dialog.locator('input[name="memory"]').getAttribute('placeholder'),
        cores: await dialog.locator('input[name="cores"]').getAttribute('placeholder'),
        policy: await dialog.locator('select[name="policy"]').inputValue()
      };
    }
    await dialog.locator('.jp-Dialog-content').screenshot({ path: `${settings.screenshots}/start-dialog.png` });
    await dialog.locator('.jp-Dialog-button.jp-mod-accept').click();
    await waitForIdleKernel(page);
    const path = await page
      .locator('.lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel')
      .innerText();
    return { shown, path, launchersBefore, launchersAfter: await launcherTabs() };
  },

  /**
   * The sidebar with a kernel a killed server left suspended and the restarted one could not
   * adopt (settings.kernelId): its notice names the connection file, one long word. Whether the
   * sidebar and every line of the row stay within the sidebar's width.
   */
  async restartNotice(browser) {
    const page = await openLab(browser, '', { reset: true });
    await openSidebar(page);
    const row = sliceRow(page, settings.kernelId);
    const notice = row.locator('.jp-vgpu-Notice', { hasText: 'jupyter console --existing' });
    await notice.waitFor();
    await page.locator('#jupyter-vgpu-sidebar').screenshot({ path: `${settings.screenshots}/sidebar-restart-notice.png` });
    const fit = await page.locator('#jupyter-vgpu-sidebar').evaluate(sidebar => {
      const right = sidebar.getBoundingClientRect().right;
      const outside = [...sidebar.querySelectorAll('.jp-vgpu-Slice *')]
        .filter(node => node.getBoundingClientRect().right > right + 0.5)
        .map(node => node.className);
      return { scrollWidth: sidebar.scrollWidth, clientWidth: sidebar.clientWidth, outside };
    });
    return { notice: await notice.innerText(), ...fit };
  },

  /**
   * settings.notebook opened with the sidebar showing its slice; then it prints
   * settings.goneMarker for the test to stop the server, and waits until the sidebar says it
   * cannot reach it: what the sidebar and the status bar show then.
   */
  async serverGone(browser) {
    const page = await openLab(browser, `tree/${settings.notebook}`);
    await waitForIdleKernel(page);
    const kernelId = await kernelIdOf(page, settings.notebook);
    await openSidebar(page);
    await sliceRow(page, kernelId).locator('[data-bar="memory"]').waitFor();
    const before = await page.locator('#jupyter-vgpu-sidebar .jp-vgpu-Slice').count();
    console.log(settings.goneMarker); // the test stops the server now
    const status = page.locator('#jupyter-vgpu-sidebar .jp-vgpu-Status', { hasText: 'Cannot reach' });
    await status.waitFor();
    await page.locator('#jupyter-vgpu-sidebar').screenshot({ path: `${settings.screenshots}/sidebar-server-gone.png` });
    return {
      before,
      status: await status.innerText(),
      rows: await page.locator('#jupyter-vgpu-sidebar .jp-vgpu-Slice').count(),
      bars: await page.locator('#jupyter-vgpu-sidebar .jp-vgpu-Bar').count(),
      statusItemVisible: await page.locator('.jp-vgpu-StatusItem').isVisible()
    };
  }
};

await runScenario(scenarios);
