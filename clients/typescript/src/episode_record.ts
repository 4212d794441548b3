// The episode record (GetEpisodeRecord): what happened in an episode, as plain objects.
import {
  EpisodeEnd,
  type EpisodeRecord as EpisodeRecordMessage,
  type ToolCallRecord as ToolCallRecordMessage,
} from "./gen/ors/v1/environment_service_pb.js";
import { refusalReason, type ToolCallErrorReason } from "./messages.js";
import { parseJson, type Json, type JsonObject } from "./types.js";

/** One tool call of an episode, as its record keeps it (never its output). */
export interface ToolCallRecord {
  toolName: string;
  /** The input; null when it was over 8 KiB of JSON (`inputOmitted`). */
  input: JsonObject | null;
  inputOmitted: boolean;
  inputBytes: number;
  reward: number | null;
  finished: boolean;
  /** Why the call was refused without running; null when it ran. */
  refusalReason: ToolCallErrorReason | null;
  /** The refusal's text or what the tool raised; null when the tool returned. */
  error: string | null;
  startedAtUnixS: number;
  /** null while the call runs. */
  endedAtUnixS: number | null;
  outputBytes: number;
}

/** What happened in an episode: its task, every tool call in order (the first 1,000), totals over all. */
export interface EpisodeRecord {
  sessionId: string;
  envName: string;
  task: Json;
  toolsetName: string | null;
  createdAtUnixS: number;
  calls: ToolCallRecord[];
  /** Calls left out by the cap (the totals include them). */
  callsDropped: number;
  totals: { calls: number; rewardSum: number; lastReward: number | null; finished: boolean };
  /** null while the episode is live. */
  ended: "deleted" | "reaped" | "server_stopped" | null;
  endedAtUnixS: number | null;
  /** Why the setup failed (secrets masked); null when it did not. */
  setupError: string | null;
}

const ENDS: Record<EpisodeEnd, EpisodeRecord["ended"]> = {
  [EpisodeEnd.UNSPECIFIED]: null,
  [EpisodeEnd.DELETED]: "deleted",
  [EpisodeEnd.REAPED]: "reaped",
  [EpisodeEnd.SERVER_STOPPED]: "server_stopped",
};

function toToolCallRecord(call: ToolCallRecordMessage): ToolCallRecord {
  return {
    toolName: call.toolName,
    input: call.input === undefined ? null : (parseJson(call.input) as JsonObject),
    inputOmitted: call.inputOmitted,
    inputBytes: Number(call.inputBytes),
    reward: call.reward ?? null,
    finished: call.finished,
    refusalReason: refusalReason(call.refusalReason),
    error: call.error || null,
    startedAtUnixS: call.startedAtUnixS,
    endedAtUnixS: call.endedAtUnixS || null,
    outputBytes: Number(call.outputBytes),
  };
}

export function toEpisodeRecord(record: EpisodeRecordMessage | undefined): EpisodeRecord {
  if (record === undefined) throw new Error("GetEpisodeRecord answered without a record");
  const totals = record.totals;
  return {
    sessionId: record.sessionId,
    envName: record.envName,
    task: parseJson(record.task),
    toolsetName: record.toolsetName ?? null,
    createdAtUnixS: record.createdAtUnixS,
    calls: record.calls.map(toToolCallRecord),
    callsDropped: Number(record.callsDropped),
    totals: {
      calls: Number(totals?.calls ?? 0n),
      rewardSum: totals?.rewardSum ?? 0,
      lastReward: totals?.lastReward ?? null,
      finished: totals?.finished ?? false,
    },
    ended: ENDS[record.ended] ?? null,
    endedAtUnixS: record.endedAtUnixS || null,
    setupError: record.setupError || null,
  };
}
