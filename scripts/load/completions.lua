-- wrk script for kvferry's load run (scripts/load-run.sh): POSTs the bodies of bodies.lua in
-- turn, checks every answer against the undisaggregated engine's text, and stops each thread
-- once it has its share of the requests. Streaming answers are checked chunk by chunk.

local bodies = dofile(os.getenv("KVFERRY_LOAD_BODIES"))
local total = tonumber(os.getenv("KVFERRY_LOAD_REQUESTS") or "1000")
local threads = {}
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("first", counter)
  table.insert(threads, thread)
end

function init(args)
  next_index = first
  seq = 0
  answered, mismatches, errors, bad = 0, 0, 0, {}
  share = math.floor(total / tonumber(os.getenv("KVFERRY_LOAD_THREADS") or "1"))
end

-- wrk gives threads no shared state: thread i sends bodies i, i+T, i+2T, ... The body's index
-- travels in X-Request-Id, which the router sends back (and the engine puts in its answer's
-- id), so each answer is checked against its own request although connections interleave.
function request()
  local T = tonumber(os.getenv("KVFERRY_LOAD_THREADS") or "1")
  local i = ((next_index - 1) % #bodies) + 1
  next_index = next_index + T
  seq = seq + 1
  return wrk.format("POST", "/v1/completions",
    {["Content-Type"] = "application/json", ["X-Request-Id"] = "load-" .. i .. "-" .. first .. "x" .. seq},
    bodies[i].body)
end

local function index_of(headers, body)
  local id = headers["X-Request-Id"] or headers["x-request-id"] or body:match('"id": "cmpl%-(load%-[^"]*)"')
  if id == nil then
    return nil
  end
  return tonumber(id:match("^load%-(%d+)%-"))
end

local function text_of(body)
  if body:find("^data: ") or body:find("\ndata: ") then
    local parts = {}
    for t in body:gmatch('"text": "(.-)"') do
      table.insert(parts, t)
    end
    if not body:find("data: %[DONE%]") then
      return nil
    end
    return table.concat(parts)
  end
  return body:match('"text": "(.-)"')
end

function response(status, headers, body)
  answered = answered + 1
  local i = index_of(headers, body)
  if status ~= 200 then
    errors = errors + 1
  elseif i == nil then
    mismatches = mismatches + 1
    if #bad < 3 then
      table.insert(bad, "an answer without its request id: " .. body:sub(1, 200))
    end
  else
    local expected = bodies[i].expected
    local got = text_of(body)
    if got ~= expected then
      mismatches = mismatches + 1
      if #bad < 3 then
        table.insert(bad, string.format("expected %q got %q", expected, tostring(got)))
      end
    end
  end
  if answered == share then
    -- wrk's main thread sleeps for the whole -d duration even once every thread stopped: a file
    -- per finished thread tells load_run.py to end it early (SIGINT makes wrk report and exit).
    local f = io.open(os.getenv("KVFERRY_LOAD_DONE_DIR") .. "/thread-" .. first, "w")
    if f then
      f:close()
    end
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local a, m, e = 0, 0, 0
  for _, t in ipairs(threads) do
    a = a + t:get("answered")
    m = m + t:get("mismatches")
    e = e + t:get("errors")
    local bad = t:get("bad")
    for _, line in ipairs(bad) do
      io.write("MISMATCH " .. line .. "\n")
    end
  end
  io.write(string.format("LOAD answered=%d mismatches=%d http_errors=%d socket_errors=%d\n",
    a, m, e, summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.timeout))
  io.write(string.format("LOAD latency_ms p50=%.2f p90=%.2f p99=%.2f max=%.2f\n",
    latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000))
end
