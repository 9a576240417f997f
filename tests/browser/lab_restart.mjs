// The browser's side of tests/browser/test_lab_restart.py: a notebook before and after its
// server is killed and started again (its kernel adopted by the new server).
//   node lab_restart.mjs SCENARIO '{"url", "token", "chromium", "notebook", "failureScreenshot"}'
// Every wait has a deadline. The last line of stdout is a JSON object of what the page showed.

import { newPage, runScenario, settings } from './scenario.mjs';

/** The notebook opened in JupyterLab, its kernel idle (the GPU status item shows once it is in a slice). */
async function openNotebook(browser) {
  const page = await newPage(browser);
  await page.goto(`${settings.url}lab/tree/${settings.notebook}?token=${settings.token}`);
  await page.locator('#jp-main-dock-panel').waitFor();
  await page.locator('.jp-vgpu-StatusItem').waitFor();
  await page
    .locator('.jp-NotebookPanel:visible .jp-Notebook-ExecutionIndicator[data-status="idle"]')
    .waitFor();
  return page;
}

/** Run a cell and wait until its output contains `expected`; the output's text. */
async function runCell(page, index, expected) {
  const target = page.locator('.jp-NotebookPanel:visible .jp-Notebook .jp-Cell').nth(index);
  await target.locator('.jp-InputArea-editor').click();
  await page.keyboard.press('Shift+Enter');
  await target.locator('.jp-OutputArea-output', { hasText: expected }).first().waitFor();
  return target.locator('.jp-OutputArea').innerText();
}

/** The kernel of the notebook's session, as the server lists it. */
async function kernelOf(page) {
  const sessions = await page.evaluate(
    async ({ url, token }) => (await fetch(`${url}api/sessions?token=${token}`)).json(),
    settings
  );
  const session = sessions.find(s => s.path === settings.notebook);
  if (!session) {
    throw new Error(`no session for ${settings.notebook}: ${JSON.stringify(sessions)}`);
  }
  return session.kernel.id;
}

const scenarios = {
  /** Before: the notebook's first cell run (it sets a variable and takes GPU memory). */
  async before(browser) {
    const page = await openNotebook(browser);
    const output = await runCell(page, 0, 'set');
    const status = await page.locator('.jp-vgpu-StatusItem', { hasText: 'GPU 1.0' }).innerText();
    return { kernelId: await kernelOf(page), output, status };
  },
  /** After the restart: the page loaded again runs the next cell in the same kernel, no dialog. */
  async after(browser) {
    const page = await openNotebook(browser);
    const kernelId = await kernelOf(page);
    const output = await runCell(page, 1, 'x is');
    const status = await page.locator('.jp-vgpu-StatusItem', { hasText: 'GPU 1.0' }).innerText();
    const dialogs = await page.locator('.jp-Dialog').count();
    // The GPU slices sidebar lists it, running, as the new server's.
    await page.locator('.jp-SideBar.jp-mod-left [data-id="jupyter-vgpu-sidebar"]').click();
    const row = page.locator(`#jupyter-vgpu-sidebar li[data-kernel-id="${kernelId}"][data-state="running"]`);
    const sidebar = await row.innerText();
    return { kernelId, output, status, dialogs, sidebar };
  }
};

await runScenario(scenarios);
