-- wrk script: POSTs the request body in $BODY (a file) with the binary-extension header length
-- in $HDR_LEN; counts non-200 answers so a benchmark never reports errors as throughput.
local f = assert(io.open(os.getenv("BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
local hl = os.getenv("HDR_LEN")
if hl and hl ~= "" then wrk.headers["Inference-Header-Content-Length"] = hl end

local errors = 0
function response(status, headers, body)
  if status ~= 200 then errors = errors + 1 end
end
function done(summary, latency, requests)
  io.write(string.format("non-200 responses: %d\n", summary.errors.status))
end
