// An ORS episode from Go, on the code templates/buf.gen.go.yaml generates from proto/
// (imported by its go_package path). Built and run by tests/client/test_generation.py.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	orsv1 "openrewardstandard.io/ors/gen/go/ors/v1"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, os.Args[1], grpc.WithInsecure(), grpc.WithBlock())
	check(err)
	defer conn.Close()
	client := orsv1.NewEnvironmentServiceClient(conn)
	minted, err := client.CreateSessionId(ctx, &orsv1.CreateSessionIdRequest{})
	check(err)
	sid := minted.GetSessionId()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-session-id", sid)
	_, err = client.CreateEpisode(ctx, &orsv1.CreateEpisodeRequest{
		SessionId: sid, EnvName: "arithmetic",
		TaskSource: &orsv1.CreateEpisodeRequest_TaskIndex{TaskIndex: &orsv1.TaskIndex{Split: "train", Index: 0}},
	})
	check(err)
	prompt, err := client.GetPrompt(ctx, &orsv1.GetPromptRequest{SessionId: sid})
	check(err)
	fmt.Println(prompt.GetBlocks()[0].GetText().GetText())
	stream, err := client.CallTool(ctx, &orsv1.CallToolRequest{SessionId: sid, Call: &orsv1.ToolCall{
		Name: "submit", Input: &orsv1.JsonValue{Json: `{"answer": 42}`},
	}})
	check(err)
	for {
		event, err := stream.Recv()
		if err == io.EOF {
			break
		}
		check(err)
		if result, ok := event.Event.(*orsv1.CallToolResponse_Result); ok {
			output := result.Result.GetOutput()
			fmt.Println(output.GetBlocks()[0].GetText().GetText(), output.GetReward(), output.GetFinished())
		}
	}
	_, err = client.DeleteEpisode(ctx, &orsv1.DeleteEpisodeRequest{SessionId: sid})
	check(err)
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
