"""`tpuctl ui`: a read-only web page over what tpuctl knows (DESIGN.md, the `ui/` layer): figures come from
control/ and core/ (views.py, runview.py), cloud calls run in the background (figures.py), the server is
server.py, and the page itself is static/ (app.js, and uPlot 1.6.32 from npm, vendored: the page works offline).
Loaded only by the command (cli/webui.py)."""
