/**
 * The server's REST API under /api/vgpu/ (described in jupyter_vgpu/server/api.yaml), through
 * Jupyter's auth.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ISliceRequest, Policy } from './slice-values';

/** What one process of a slice holds and uses (a Slice's usage.processes item in api.yaml). */
export interface IProcessUsage {
  pid: number;
  memory_bytes: number;
  /** Measured SM utilisation, percent of the device. */
  sm_util: number;
  /** Allocations refused because the slice was at its cap. */
  oom_refusals: number;
}

/** Where a slice lives: processes on this machine, or a Kubernetes pod the cluster placed. */
export type SliceHolder = 'local' | 'pod';

/**
 * A slice's state (Slice.state in api.yaml). Any holder: `running`, `unused` (held, no process
 * of the kernel has used the GPU in it yet; not Jupyter's "idle"), `lost` (its holder is gone).
 * A local slice also `queued` (its kernel's start waits in the line for room; `queue` says
 * where it stands), `suspended` (its GPU memory in host memory, its room lent; its next cell
 * resumes it) and `lent` (its kernel had not used the GPU, so its room is lent to others; its
 * first CUDA call takes it back, or waits in the line for it), and while its memory moves
 * `suspending` (to host memory) and `resuming` (its room back, its memory copied back).
 * A pod's slice also: `scheduling` (waiting for the scheduler), `pulling` (the image), `starting`
 * (the container), `stopping`, `failed`, `exited`, `gone` (the pod was deleted).
 */
export type SliceState =
  | 'queued'
  | 'running'
  | 'lent'
  | 'unused'
  | 'lost'
  | 'suspended'
  | 'suspending'
  | 'resuming'
  | 'scheduling'
  | 'pulling'
  | 'starting'
  | 'stopping'
  | 'failed'
  | 'exited'
  | 'gone';

/**
 * Where a pod's slice is (Slice.location in api.yaml): `pod` and `namespace`, and once the pod is
 * scheduled `node` and `gpu` (e.g. "GPU-8f2c1d (4096 MiB, 30%)"); '' or absent until known.
 * Empty for a local slice.
 */
export interface ISliceLocation {
  pod?: string;
  namespace?: string;
  node?: string;
  gpu?: string;
  [key: string]: string | undefined;
}

/**
 * Where a slice's request for room stands in the line (Queue in api.yaml): a start, or a
 * suspended or lent kernel taking its room back.
 */
export interface IQueuePlace {
  /** 1 is next. */
  position: number;
  /** About how long until it has room; null where the server cannot tell (no guesses). */
  eta_seconds: number | null;
  /** What it waits for, in a few words ("6GiB more GPU memory (4GiB free)"); may be ''. */
  waiting_for: string;
}

/** A device of the server's machine that holds a local slice. */
export interface IDeviceRef {
  index: number;
  uuid: string;
}

/**
 * GET /api/vgpu/slices item (Slice in jupyter_vgpu/server/api.yaml). Sizes are bytes, named so;
 * `cores` is the SM share in percent.
 */
export interface ISliceModel {
  kernel_id: string;
  kernelspec: string;
  /** The notebook of the kernel's session, or '' when it has none. */
  path: string;
  owner: string;
  holder: SliceHolder;
  state: SliceState;
  /**
   * What the slice's kernel is doing, as Jupyter says it: 'idle', 'busy' (a cell runs; a kernel a
   * restarted server adopted reads 'busy' until it said what it does), 'starting', ...; null where
   * the kernel is not the server's own (absent from an older server).
   */
  execution_state?: string | null;
  /** Bytes of the kernel's GPU memory in host memory while it is suspended; 0 (or absent, from an older server) otherwise. */
  host_memory_bytes?: number;
  /** The state in a sentence where there is more to say (a pod's), else ''. */
  message: string;
  /** Where a pod's slice is; {} for a local slice. */
  location: ISliceLocation;
  /**
   * The device of the server's machine that holds the slice (a queued start: the one it waits
   * for); null for a pod's slice, and for a queued start that takes any GPU.
   */
  device: IDeviceRef | null;
  limits: ILimitsModel;
  usage: { memory_bytes: number; sm_util: number; processes: IProcessUsage[] };
  /** Sentences for people about something wrong with the slice; empty normally. */
  warnings: string[];
  /**
   * What the server's idle policy did to the slice, for the student ("lowered to 5% of the SMs
   * after 20 min idle; restored when it runs again", or why its share was not given back); null
   * (or absent, from an older server) when there is nothing to tell.
   */
  notice?: string | null;
  /**
   * Where its request for room stands in the line while it waits (a queued start, a suspended or
   * lent kernel whose cell waits for its room); null (or absent, from an older server) otherwise.
   */
  queue?: IQueuePlace | null;
}

/** A slice's limits (Limits in api.yaml): GET /api/vgpu/defaults, a slice's `limits`. */
export interface ILimitsModel {
  memory_bytes: number;
  cores: number;
  policy: Policy;
}

/** GET /api/vgpu/devices item (Device in jupyter_vgpu/server/api.yaml). */
export interface IDeviceModel {
  index: number;
  uuid: string;
  name: string;
  sm_count: number;
  memory_total_bytes: number;
  memory_capacity_bytes: number;
  memory_allocated_bytes: number;
  memory_free_bytes: number;
  /** Held by processes of no slice (a program outside Jupyter, a dead server's leftovers); never promised. Absent from an older server. */
  memory_outside_bytes?: number;
  /** Held by slices' processes past their slices' caps; never promised. Absent from an older server. */
  memory_over_cap_bytes?: number;
  sm_share_allocated: number;
  sm_share_hard_allocated: number;
  sm_share_capacity: number;
  slices: number;
}

/** A refusal by the server; the message is the server's own ({"message": ...}). */
export class VGPUServerError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

async function request<T>(path: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'api', 'vgpu', path);
  const response = await ServerConnection.makeRequest(url, init, settings);
  const text = await response.text();
  if (!response.ok) {
    let message = text || response.statusText;
    try {
      message = JSON.parse(text).message ?? message;
    } catch {
      // Not JSON (a proxy's error page): show it as it came.
    }
    throw new VGPUServerError(response.status, message);
  }
  return JSON.parse(text) as T;
}

export function listSlices(): Promise<ISliceModel[]> {
  return request<ISliceModel[]>('slices');
}

export function listDevices(): Promise<IDeviceModel[]> {
  return request<IDeviceModel[]>('devices');
}

/**
 * GET /api/vgpu/defaults: the slice a start gets for each field neither its request nor its
 * kernelspec sets (the server's VGPUApp.default_memory, default_cores, default_policy).
 */
export function getDefaults(): Promise<ILimitsModel> {
  return request<ILimitsModel>('defaults');
}

/**
 * GET /api/vgpu/notices: why kernels of this server were stopped as idle (kernel id -> notice);
 * a stopped kernel's slice is no longer listed, so this is where its notebook learns why.
 */
export function listNotices(): Promise<Record<string, string>> {
  return request<Record<string, string>>('notices');
}

export function resizeSlice(
  kernelId: string,
  change: ISliceRequest
): Promise<ISliceModel> {
  return request<ISliceModel>(`slices/${encodeURIComponent(kernelId)}`, {
    method: 'PATCH',
    body: JSON.stringify(change)
  });
}

/**
 * POST /api/vgpu/slices/{kernel_id}/resume or /suspend: the slice after it (409 with the
 * server's reason when refused, e.g. no room on its device to resume).
 */
export function changeSuspension(
  kernelId: string,
  action: 'resume' | 'suspend'
): Promise<ISliceModel> {
  return request<ISliceModel>(
    `slices/${encodeURIComponent(kernelId)}/${action}`,
    { method: 'POST' }
  );
}

/**
 * POST /api/vgpu/slices/{kernel_id}/wake: the user turned to the kernel; a suspended or lent one
 * joins the line to resume now (202), a running one answers as it is (200). Its slice.
 */
export function wakeSlice(kernelId: string): Promise<ISliceModel> {
  return request<ISliceModel>(`slices/${encodeURIComponent(kernelId)}/wake`, {
    method: 'POST'
  });
}

/** POST /api/vgpu/kernels: a kernel of a vGPU kernelspec started in a slice of the asked size. */
export function startKernel(
  name: string,
  slice: ISliceRequest,
  path: string
): Promise<{ kernel: { id: string; name: string }; slice: ISliceModel }> {
  return request('kernels', {
    method: 'POST',
    body: JSON.stringify({ name, path, ...slice })
  });
}
